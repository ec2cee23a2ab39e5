//! The host controller's lanes: the fair scheduler of [`hostcycle_core::bmh::lanes`] behind a
//! lock, handing each grant to the reconcile waiting for it.
//!
//! Which lane a host's reconcile claims is read from the object alone ([`claim_for`]): a
//! remediation power-off annotation claims the fencing lane, any other requested action the
//! action lane, anything else the steady lane; the claim names the host's namespace and BMC
//! endpoint, for the per-namespace and per-BMC caps.

use std::sync::{Arc, Mutex, MutexGuard};

use hostcycle_api::BareMetalHost;
use hostcycle_api::remediation::is_remediation_power_off;
use hostcycle_core::bmh::lanes::{Claim, Lane, LaneBook, LaneLimits, Slot, Ticket};
use kube::ResourceExt;
use tokio::sync::oneshot;

use super::controller::wants_action;
use crate::metrics::{LaneLabels, Metrics};

/// What a reconcile of `host` claims, read from the object alone (no BMC call).
pub fn claim_for(host: &BareMetalHost) -> Claim {
    let fencing = host
        .annotations_or_empty()
        .keys()
        .any(|key| is_remediation_power_off(key));
    let class = if fencing {
        Lane::Fencing
    } else if wants_action(host) {
        Lane::Action
    } else {
        Lane::Steady
    };
    Claim {
        class,
        namespace: host.namespace().unwrap_or_default(),
        bmc: bmc_endpoint(host),
    }
}

/// The endpoint (scheme, host, port) of the host's BMC, the key of the per-BMC cap; `None`
/// when the address is missing or invalid (the reconcile then makes no BMC call).
fn bmc_endpoint(host: &BareMetalHost) -> Option<String> {
    let address = host.spec.bmc.as_ref()?.address.trim();
    if address.is_empty() {
        return None;
    }
    hostcycle_bmc::BmcAddress::parse(address)
        .ok()
        .map(|parsed| parsed.endpoint())
}

/// The lanes were dropped while a reconcile waited (the controller is stopping).
#[derive(Debug)]
pub struct LanesClosed;

/// The slots of every lane and the reconciles waiting for one.
pub struct Lanes {
    book: Mutex<LaneBook<oneshot::Sender<Slot>>>,
    metrics: Arc<Metrics>,
}

/// A slot of a lane, given back when dropped.
pub struct LaneSlot {
    lanes: Arc<Lanes>,
    slot: Option<Slot>,
}

impl LaneSlot {
    pub fn lane(&self) -> Option<Lane> {
        self.slot.as_ref().map(|s| s.lane)
    }
}

impl Drop for LaneSlot {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.lanes.lock().release(&slot);
            self.lanes.dispatch();
        }
    }
}

/// A claim waiting in the book. Dropped before its grant arrived (the reconcile stopped
/// waiting: promoted to another lane, or stopped), it is withdrawn, or its slot given back if
/// it was granted meanwhile.
struct Waiting<'a> {
    lanes: &'a Arc<Lanes>,
    ticket: Ticket,
    grant: Option<oneshot::Receiver<Slot>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(mut grant) = self.grant.take() else {
            return;
        };
        let withdrawn = self.lanes.lock().cancel(&self.ticket).is_some();
        if withdrawn {
            self.lanes.update_metrics();
            return;
        }
        // Granted: the slot is in the channel, or the sender finds the channel closed and
        // gives it back itself.
        grant.close();
        if let Ok(slot) = grant.try_recv() {
            self.lanes.lock().release(&slot);
            self.lanes.dispatch();
        }
    }
}

impl Lanes {
    pub fn new(limits: LaneLimits, metrics: Arc<Metrics>) -> Arc<Lanes> {
        let lanes = Arc::new(Lanes {
            book: Mutex::new(LaneBook::new(limits)),
            metrics,
        });
        lanes.update_metrics();
        lanes
    }

    fn lock(&self) -> MutexGuard<'_, LaneBook<oneshot::Sender<Slot>>> {
        match self.book.lock() {
            Ok(book) => book,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Waits for a slot for `claim`, in the book's order (see
    /// [`hostcycle_core::bmh::lanes`]). Cancel-safe: dropping the future withdraws the claim.
    pub async fn acquire(self: &Arc<Self>, claim: Claim) -> Result<LaneSlot, LanesClosed> {
        let (sender, receiver) = oneshot::channel();
        let ticket = self.lock().enqueue(claim, sender);
        let mut waiting = Waiting {
            lanes: self,
            ticket,
            grant: Some(receiver),
        };
        self.dispatch();
        let granted = match waiting.grant.as_mut() {
            Some(receiver) => receiver.await,
            None => return Err(LanesClosed),
        };
        // Arrived: nothing to withdraw any more.
        waiting.grant = None;
        match granted {
            Ok(slot) => Ok(LaneSlot {
                lanes: self.clone(),
                slot: Some(slot),
            }),
            Err(_) => Err(LanesClosed),
        }
    }

    /// Hands out every slot the book can grant now.
    fn dispatch(&self) {
        loop {
            // The lock is released before anything else is done with the grant.
            let grant = self.lock().next_grant();
            let Some((sender, slot)) = grant else {
                self.update_metrics();
                return;
            };
            if let Err(slot) = sender.send(slot) {
                // The reconcile stopped waiting as it was granted: the slot is free again.
                self.lock().release(&slot);
            }
        }
    }

    /// `hostcycle_lane_waiting{lane}` and `hostcycle_lane_slots_in_use{lane}`.
    fn update_metrics(&self) {
        let (waiting, held) = {
            let book = self.lock();
            (
                Lane::ALL.map(|lane| book.waiting(lane)),
                Lane::ALL.map(|lane| book.held(lane)),
            )
        };
        for (i, lane) in Lane::ALL.into_iter().enumerate() {
            let labels = LaneLabels {
                lane: lane.as_str().into(),
            };
            let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            self.metrics
                .lane_waiting
                .get_or_create(&labels)
                .set(gauge(waiting[i]));
            self.metrics
                .lane_slots_in_use
                .get_or_create(&labels)
                .set(gauge(held[i]));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    fn lanes(limits: LaneLimits) -> Arc<Lanes> {
        Lanes::new(
            limits,
            Metrics::register(&mut crate::metrics::new_registry()),
        )
    }

    fn claim(class: Lane, namespace: &str) -> Claim {
        Claim {
            class,
            namespace: namespace.into(),
            bmc: None,
        }
    }

    /// A slot whose waiter stopped waiting (promoted, stopped) is never lost: a withdrawn
    /// claim frees nothing it did not hold, and a claim granted as it was dropped gives its
    /// slot back.
    #[tokio::test]
    async fn slots_of_reconciles_that_stopped_waiting_are_not_lost() {
        let lanes = lanes(LaneLimits::new(1, 1, 1, 100, 8));
        let held = lanes.acquire(claim(Lane::Steady, "a")).await.unwrap();
        // Waits (the lane is full), then is dropped: withdrawn.
        let waiting = lanes.acquire(claim(Lane::Steady, "b"));
        assert!(
            tokio::time::timeout(Duration::from_millis(50), waiting)
                .await
                .is_err()
        );
        assert_eq!(lanes.lock().waiting(Lane::Steady), 0);
        // Granted while nobody polls it any more: the slot comes back when it is dropped.
        let mut granted_unpolled = Box::pin(lanes.acquire(claim(Lane::Steady, "c")));
        assert!(futures::poll!(granted_unpolled.as_mut()).is_pending());
        drop(held);
        assert_eq!(lanes.lock().held(Lane::Steady), 1, "handed to c");
        drop(granted_unpolled);
        assert_eq!(lanes.lock().held(Lane::Steady), 0);
        let again = tokio::time::timeout(
            Duration::from_secs(1),
            lanes.acquire(claim(Lane::Steady, "d")),
        )
        .await;
        assert!(matches!(again, Ok(Ok(_))), "the slot is free again");
    }

    /// With every action slot held by one namespace's hung hosts, another namespace's action
    /// and a power-off for remediation are served at once.
    #[tokio::test]
    async fn a_full_namespace_does_not_hold_back_the_others() {
        let lanes = lanes(LaneLimits::new(16, 64, 64, 50, 8));
        let mut hung = Vec::new();
        let mut waiting = Vec::new();
        for _ in 0..64 {
            let mut wait = Box::pin(lanes.acquire(claim(Lane::Action, "tenant")));
            match futures::poll!(wait.as_mut()) {
                std::task::Poll::Ready(slot) => hung.push(slot.unwrap()),
                std::task::Poll::Pending => waiting.push(wait),
            }
        }
        assert_eq!((hung.len(), waiting.len()), (32, 32));
        let in_time = |c| tokio::time::timeout(Duration::from_millis(100), lanes.acquire(c));
        let other = in_time(claim(Lane::Action, "other"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(other.lane(), Some(Lane::Action));
        let fence = in_time(claim(Lane::Fencing, "fenced"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(fence.lane(), Some(Lane::Fencing));
    }

    #[test]
    fn claims_are_read_from_the_object() {
        use hostcycle_api::remediation::{
            MACHINE_POWER_OFF_ANNOTATION, request_power_off_annotation,
        };
        let host = |annotations: &[&str]| {
            let mut h = BareMetalHost::externally_provisioned(
                "h",
                "redfish://10.0.0.7/redfish/v1/Systems/1",
                "bmc",
            );
            h.metadata.namespace = Some("ns".into());
            h.metadata.annotations = Some(
                annotations
                    .iter()
                    .map(|k| (k.to_string(), r#"{"mode":"hard"}"#.to_string()))
                    .collect(),
            );
            h
        };
        #[rustfmt::skip]
        let cases = [
            (host(&[]), Lane::Steady),
            (host(&["reboot.metal3.io"]), Lane::Action),
            (host(&["reboot.metal3.io/maintenance"]), Lane::Action),
            (host(&[MACHINE_POWER_OFF_ANNOTATION]), Lane::Fencing),
            (host(&[&request_power_off_annotation("0a1b")]), Lane::Fencing),
            (host(&["reboot.metal3.io", MACHINE_POWER_OFF_ANNOTATION]), Lane::Fencing),
            (host(&["example.com/other"]), Lane::Steady),
        ];
        for (h, lane) in cases {
            let claim = claim_for(&h);
            assert_eq!(claim.class, lane, "{:?}", h.metadata.annotations);
            assert_eq!(claim.namespace, "ns");
            assert_eq!(claim.bmc.as_deref(), Some("https://10.0.0.7:443"));
        }
        let mut no_bmc = host(&[]);
        no_bmc.spec.bmc = None;
        assert_eq!(claim_for(&no_bmc).bmc, None);
    }
}
