//! Power-off semantics used by the controller: soft first; when the host is still on after
//! the soft timeout, hard; a hard request always wins. The report records the path taken.

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::driver::{PowerDriver, PowerOffMode, PowerOutcome, PowerState};
use crate::error::BmcError;

/// The shortest time between two power-state reads while waiting.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Timing of a power-off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SoftOffPolicy {
    /// How long the OS gets to shut down after a soft request before power is cut.
    pub soft_timeout: Duration,
    /// How often the power state is read while waiting.
    pub poll_interval: Duration,
    /// How long to wait for the host to be off after a hard request.
    pub hard_timeout: Duration,
}

impl Default for SoftOffPolicy {
    fn default() -> Self {
        SoftOffPolicy {
            soft_timeout: Duration::from_secs(180),
            poll_interval: Duration::from_secs(5),
            hard_timeout: Duration::from_secs(120),
        }
    }
}

/// Which way the host went off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum OffPath {
    /// It already was off; nothing was sent.
    AlreadyOff,
    /// The soft request worked within the soft timeout.
    Soft,
    /// Hard was asked for.
    Hard,
    /// The BMC does not offer soft off or rejected it, so hard was used at once.
    SoftUnavailable,
    /// Still on after the soft timeout; hard followed.
    SoftTimedOut,
    /// A hard request arrived while waiting for the soft one.
    Escalated,
}

impl OffPath {
    /// Whether power was cut without (or before the end of) a clean shutdown.
    pub fn was_hard(self) -> bool {
        !matches!(self, OffPath::AlreadyOff | OffPath::Soft)
    }
}

/// What a power-off did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PowerOffReport {
    pub path: OffPath,
    /// Every request sent, in order (one, or soft then hard).
    pub outcomes: Vec<PowerOutcome>,
    #[serde(serialize_with = "serialize_secs")]
    pub elapsed: Duration,
}

fn serialize_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 10.0).round() / 10.0)
}

/// Powers the host off and waits until it is off.
///
/// `mode == Hard` cuts power at once. `Soft` asks for a clean shutdown and waits up to
/// `policy.soft_timeout`; then, or as soon as `escalate` is cancelled (a hard request came
/// in), it cuts power. Errors when the host is not off within `hard_timeout` after the hard
/// request, or on a permanent BMC error; transient errors while polling are logged and the
/// wait goes on.
pub async fn power_off_with_fallback(
    driver: &dyn PowerDriver,
    mode: PowerOffMode,
    policy: &SoftOffPolicy,
    escalate: Option<&CancellationToken>,
) -> Result<PowerOffReport, BmcError> {
    let start = Instant::now();
    let hard_now = mode == PowerOffMode::Hard || escalate.is_some_and(|t| t.is_cancelled());
    let first = driver
        .power_off(if hard_now { PowerOffMode::Hard } else { mode })
        .await?;
    if first.action.is_none() {
        return Ok(report(OffPath::AlreadyOff, vec![first], start));
    }
    if hard_now || first.fell_back_to_hard() {
        let path = if hard_now {
            OffPath::Hard
        } else {
            OffPath::SoftUnavailable
        };
        wait_for_power_state(
            driver,
            PowerState::Off,
            policy.hard_timeout,
            policy.poll_interval,
        )
        .await?;
        return Ok(report(path, vec![first], start));
    }

    let never = CancellationToken::new();
    let escalate = escalate.unwrap_or(&never);
    let soft_wait = wait_for_power_state(
        driver,
        PowerState::Off,
        policy.soft_timeout,
        policy.poll_interval,
    );
    let path = tokio::select! {
        result = soft_wait => match result {
            Ok(_) => return Ok(report(OffPath::Soft, vec![first], start)),
            Err(BmcError::PowerStateNotReached { .. }) => OffPath::SoftTimedOut,
            Err(e) => return Err(e),
        },
        () = escalate.cancelled() => OffPath::Escalated,
    };
    tracing::info!(
        driver = %driver.description(),
        ?path,
        soft_timeout_s = policy.soft_timeout.as_secs(),
        "host not off after soft request; cutting power"
    );
    let second = driver.power_off(PowerOffMode::Hard).await?;
    wait_for_power_state(
        driver,
        PowerState::Off,
        policy.hard_timeout,
        policy.poll_interval,
    )
    .await?;
    Ok(report(path, vec![first, second], start))
}

fn report(path: OffPath, outcomes: Vec<PowerOutcome>, start: Instant) -> PowerOffReport {
    PowerOffReport {
        path,
        outcomes,
        elapsed: start.elapsed(),
    }
}

/// Polls until the host reports `expected`, for at most `timeout`. Transient read errors
/// are retried at the next poll; permanent ones are returned.
pub async fn wait_for_power_state(
    driver: &dyn PowerDriver,
    expected: PowerState,
    timeout: Duration,
    poll_interval: Duration,
) -> Result<PowerState, BmcError> {
    let deadline = crate::deadline::deadline_after(Instant::now(), timeout);
    // A zero interval would poll the BMC in a busy loop.
    let poll_interval = poll_interval.max(MIN_POLL_INTERVAL);
    let mut last = String::from("not read yet");
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining, driver.power_state()).await {
            Ok(Ok(state)) if state == expected => return Ok(state),
            Ok(Ok(state)) => last = state.to_string(),
            Ok(Err(e)) if e.is_transient() => {
                tracing::debug!(driver = %driver.description(), error = %e, "power state read failed");
                last = format!("error: {e}");
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => {}
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(BmcError::PowerStateNotReached {
                expected: expected.to_string(),
                after: timeout,
                last,
            });
        }
        tokio::time::sleep(poll_interval.min(deadline.saturating_duration_since(now))).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::*;
    use crate::driver::{DriverDescription, DriverKind, PowerRequest};

    /// An in-memory host: power changes take `delay`; soft requests are ignored when
    /// `soft_ignored` (an OS that does not react to ACPI).
    #[derive(Debug)]
    struct FakeHost {
        state: Mutex<(PowerState, Option<(Instant, PowerState)>)>,
        soft_ignored: bool,
        soft_unavailable: bool,
        delay: Duration,
        requests: Mutex<Vec<PowerOffMode>>,
    }

    impl FakeHost {
        fn new(state: PowerState, soft_ignored: bool) -> Self {
            FakeHost {
                state: Mutex::new((state, None)),
                soft_ignored,
                soft_unavailable: false,
                delay: Duration::from_secs(2),
                requests: Mutex::new(Vec::new()),
            }
        }
    }

    #[async_trait]
    impl PowerDriver for FakeHost {
        fn description(&self) -> DriverDescription {
            DriverDescription {
                kind: DriverKind::Command,
                endpoint: "fake".into(),
                detail: "".into(),
            }
        }
        async fn power_state(&self) -> Result<PowerState, BmcError> {
            let mut s = self.state.lock().unwrap();
            if let Some((when, target)) = s.1
                && Instant::now() >= when
            {
                *s = (target, None);
            }
            Ok(s.0)
        }
        async fn power_on(&self) -> Result<PowerOutcome, BmcError> {
            unimplemented!()
        }
        async fn power_off(&self, mode: PowerOffMode) -> Result<PowerOutcome, BmcError> {
            let request = PowerRequest::Off(mode);
            if self.power_state().await? == PowerState::Off {
                return Ok(PowerOutcome::already_done(request));
            }
            self.requests.lock().unwrap().push(mode);
            let mut outcome = PowerOutcome::sent(request, format!("{mode}"));
            if mode == PowerOffMode::Soft && self.soft_unavailable {
                outcome.hard_fallback = Some("no soft here".into());
            } else if mode == PowerOffMode::Soft && self.soft_ignored {
                return Ok(outcome);
            }
            self.state.lock().unwrap().1 = Some((Instant::now() + self.delay, PowerState::Off));
            Ok(outcome)
        }
        async fn reboot(&self, _mode: PowerOffMode) -> Result<PowerOutcome, BmcError> {
            unimplemented!()
        }
    }

    fn policy() -> SoftOffPolicy {
        SoftOffPolicy {
            soft_timeout: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            hard_timeout: Duration::from_secs(10),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn soft_works_within_the_timeout() {
        let host = FakeHost::new(PowerState::On, false);
        let report = power_off_with_fallback(&host, PowerOffMode::Soft, &policy(), None)
            .await
            .unwrap();
        assert_eq!(report.path, OffPath::Soft);
        assert_eq!(*host.requests.lock().unwrap(), vec![PowerOffMode::Soft]);
        assert!(report.elapsed < Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn falls_back_to_hard_after_the_soft_timeout() {
        let host = FakeHost::new(PowerState::On, true);
        let report = power_off_with_fallback(&host, PowerOffMode::Soft, &policy(), None)
            .await
            .unwrap();
        assert_eq!(report.path, OffPath::SoftTimedOut);
        assert!(report.path.was_hard());
        assert_eq!(
            *host.requests.lock().unwrap(),
            vec![PowerOffMode::Soft, PowerOffMode::Hard]
        );
        assert!(
            report.elapsed >= Duration::from_secs(30),
            "{:?}",
            report.elapsed
        );
        assert_eq!(report.outcomes.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn hard_request_skips_soft() {
        let host = FakeHost::new(PowerState::On, true);
        let report = power_off_with_fallback(&host, PowerOffMode::Hard, &policy(), None)
            .await
            .unwrap();
        assert_eq!(report.path, OffPath::Hard);
        assert_eq!(*host.requests.lock().unwrap(), vec![PowerOffMode::Hard]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hard_request_during_the_soft_wait_wins() {
        let host = FakeHost::new(PowerState::On, true);
        let escalate = CancellationToken::new();
        let trigger = escalate.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            trigger.cancel();
        });
        let report = power_off_with_fallback(&host, PowerOffMode::Soft, &policy(), Some(&escalate))
            .await
            .unwrap();
        assert_eq!(report.path, OffPath::Escalated);
        assert!(
            report.elapsed < Duration::from_secs(30),
            "{:?}",
            report.elapsed
        );
        assert_eq!(
            *host.requests.lock().unwrap(),
            vec![PowerOffMode::Soft, PowerOffMode::Hard]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn already_off_sends_nothing() {
        let host = FakeHost::new(PowerState::Off, false);
        let report = power_off_with_fallback(&host, PowerOffMode::Soft, &policy(), None)
            .await
            .unwrap();
        assert_eq!(report.path, OffPath::AlreadyOff);
        assert!(host.requests.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn soft_unavailable_is_recorded() {
        let mut host = FakeHost::new(PowerState::On, false);
        host.soft_unavailable = true;
        let report = power_off_with_fallback(&host, PowerOffMode::Soft, &policy(), None)
            .await
            .unwrap();
        assert_eq!(report.path, OffPath::SoftUnavailable);
        assert_eq!(
            report.outcomes[0].hard_fallback.as_deref(),
            Some("no soft here")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_host_that_never_goes_off_is_an_error_naming_the_state() {
        let mut host = FakeHost::new(PowerState::On, true);
        host.delay = Duration::from_secs(3600);
        let err = power_off_with_fallback(&host, PowerOffMode::Hard, &policy(), None)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the host did not reach power state off within 10s (last seen: on)"
        );
    }
}
