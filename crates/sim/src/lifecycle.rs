//! The pure lifecycle of one simulated host: power observations in, kubelet actions out.

use std::time::{Duration, Instant};

use crate::power::HostPower;

/// Where a simulated host is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostLifecycle {
    /// No power: the kubelet is silent.
    Off,
    /// Power came on at `since`; the kubelet starts after the boot delay.
    Booting { since: Instant },
    /// The kubelet runs; `boot` counts boots so restarted pods can be told apart.
    Running { boot: u32 },
}

/// What the kubelet shell must do after a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LifecycleAction {
    /// Register or re-register the Node, post Ready, renew the Lease, restart bound pods.
    Boot { boot: u32 },
    /// Power went away: stop all heartbeats and pod updates.
    Halt,
}

/// Advances the lifecycle. `observed` is `None` while the BMC reports a transition or an
/// error; the host then keeps doing what it did (a transition is not yet a power change).
pub fn step(
    state: HostLifecycle,
    boots_so_far: u32,
    observed: Option<HostPower>,
    now: Instant,
    boot_delay: Duration,
) -> (HostLifecycle, Option<LifecycleAction>) {
    match (state, observed) {
        (HostLifecycle::Off, Some(HostPower::On)) => {
            if boot_delay.is_zero() {
                let boot = boots_so_far + 1;
                (
                    HostLifecycle::Running { boot },
                    Some(LifecycleAction::Boot { boot }),
                )
            } else {
                (HostLifecycle::Booting { since: now }, None)
            }
        }
        (HostLifecycle::Booting { since }, Some(HostPower::On) | None) => {
            if now.duration_since(since) >= boot_delay {
                let boot = boots_so_far + 1;
                (
                    HostLifecycle::Running { boot },
                    Some(LifecycleAction::Boot { boot }),
                )
            } else {
                (state, None)
            }
        }
        (HostLifecycle::Booting { .. }, Some(HostPower::Off)) => (HostLifecycle::Off, None),
        (HostLifecycle::Running { .. }, Some(HostPower::Off)) => {
            (HostLifecycle::Off, Some(LifecycleAction::Halt))
        }
        (s, _) => (s, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_secs(2);

    /// name, state, boots so far, observed power, now, expected state, expected action
    type Case = (
        &'static str,
        HostLifecycle,
        u32,
        Option<HostPower>,
        Instant,
        HostLifecycle,
        Option<LifecycleAction>,
    );

    #[test]
    fn table() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let t3 = t0 + Duration::from_secs(3);
        let booting = HostLifecycle::Booting { since: t0 };
        let running = HostLifecycle::Running { boot: 1 };
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            ("off stays off",                 HostLifecycle::Off, 0, Some(HostPower::Off), t0, HostLifecycle::Off, None),
            ("off + transition stays off",    HostLifecycle::Off, 0, None, t0, HostLifecycle::Off, None),
            ("power on starts booting",       HostLifecycle::Off, 0, Some(HostPower::On), t0, booting, None),
            ("boot delay not yet over",       booting, 0, Some(HostPower::On), t1, booting, None),
            ("boot delay over boots",         booting, 0, Some(HostPower::On), t3, HostLifecycle::Running { boot: 1 }, Some(LifecycleAction::Boot { boot: 1 })),
            ("second boot counts up",         booting, 4, Some(HostPower::On), t3, HostLifecycle::Running { boot: 5 }, Some(LifecycleAction::Boot { boot: 5 })),
            ("power lost while booting",      booting, 0, Some(HostPower::Off), t1, HostLifecycle::Off, None),
            ("running keeps running",         running, 1, Some(HostPower::On), t3, running, None),
            ("running ignores transitions",   running, 1, None, t3, running, None),
            ("power off halts",               running, 1, Some(HostPower::Off), t3, HostLifecycle::Off, Some(LifecycleAction::Halt)),
        ];
        for (name, state, boots, observed, now, want_state, want_action) in cases {
            let (got_state, got_action) = step(state, boots, observed, now, DELAY);
            assert_eq!(got_state, want_state, "{name}: state");
            assert_eq!(got_action, want_action, "{name}: action");
        }
    }

    #[test]
    fn zero_boot_delay_boots_at_once() {
        let (s, a) = step(
            HostLifecycle::Off,
            0,
            Some(HostPower::On),
            Instant::now(),
            Duration::ZERO,
        );
        assert_eq!(s, HostLifecycle::Running { boot: 1 });
        assert_eq!(a, Some(LifecycleAction::Boot { boot: 1 }));
    }
}
