//! How far this replica's clock is from the API server's, measured, not assumed.
//!
//! Fencing compares times written by different clocks: a remediation's power-off request time
//! and the host controller's readings (another replica's after a failover), metal3's stamps. A
//! replica whose clock is off could take readings made before a request for readings made
//! after it. So the remediation controller measures its clock against the API server's `Date`
//! header every [`INTERVAL`] and refuses time-based evidence while the skew exceeds
//! `--max-clock-skew` ([`ClockSkew::untrusted`]). `Date` has whole seconds: the server's time
//! lies in `[Date, Date + 1 s)`, so the estimate is `Date + 0.5 s` against the middle of the
//! round trip, good to half a second plus half the round trip.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// How often the skew is measured.
pub const INTERVAL: Duration = Duration::from_secs(30);

/// No measurement yet (or the last one failed).
const UNKNOWN: i64 = i64::MIN;

/// The last measured skew (server minus local), shared with the controller's passes.
#[derive(Debug, Clone)]
pub struct ClockSkew {
    millis: Arc<AtomicI64>,
    bound: Duration,
}

impl ClockSkew {
    pub fn new(bound: Duration) -> Self {
        ClockSkew {
            millis: Arc::new(AtomicI64::new(UNKNOWN)),
            bound,
        }
    }

    /// The last measurement, if any.
    pub fn skew(&self) -> Option<SignedDuration> {
        match self.millis.load(Ordering::Relaxed) {
            UNKNOWN => None,
            ms => Some(SignedDuration::from_millis(ms)),
        }
    }

    fn record(&self, skew: Option<SignedDuration>) {
        let ms = skew.map_or(UNKNOWN, |s| {
            i64::try_from(s.as_millis()).unwrap_or(i64::MAX)
        });
        self.millis.store(ms, Ordering::Relaxed);
    }

    /// Why time-based evidence is refused now, if it is: the last measured skew exceeds the
    /// bound. Not measured yet: trusted (the first measurement runs before the first pass that
    /// could release anything, and a failed one keeps the last value).
    pub fn untrusted(&self) -> Option<String> {
        let skew = self.skew()?;
        let bound = SignedDuration::try_from(self.bound).unwrap_or(SignedDuration::MAX);
        (skew.abs() > bound).then(|| {
            format!(
                "this replica's clock is {:.1}s off the API server's, more than \
                 --max-clock-skew {}s: times written by different clocks cannot be compared; fix \
                 the nodes' time synchronisation (NTP)",
                skew.as_secs_f64(),
                self.bound.as_secs()
            )
        })
    }
}

/// The skew estimated from the server's `Date` header and the local times a request was sent
/// and its answer received: `Date + 0.5 s` minus the middle of the round trip.
pub fn estimate(date_header: &str, sent: Timestamp, received: Timestamp) -> Option<SignedDuration> {
    let server = jiff::fmt::rfc2822::parse(date_header.trim())
        .ok()?
        .timestamp();
    let half_trip = received.duration_since(sent) / 2;
    let middle = sent.checked_add(half_trip).ok()?;
    let server_mid = server.checked_add(SignedDuration::from_millis(500)).ok()?;
    Some(server_mid.duration_since(middle))
}

/// Measures the skew now: one small GET (`/version`).
async fn measure(client: &Client) -> Option<SignedDuration> {
    let request = ::http::Request::get("/version").body(Vec::new()).ok()?;
    let sent = Timestamp::now();
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        client.send(request.map(Into::into)),
    )
    .await
    .ok()?
    .ok()?;
    let received = Timestamp::now();
    let date = response
        .headers()
        .get(::http::header::DATE)?
        .to_str()
        .ok()?;
    estimate(date, sent, received)
}

/// Measures every [`INTERVAL`] until `shutdown`, recording into `skew` and the
/// `hostcycle_clock_skew_seconds` gauge (server minus local); logs when the bound is crossed.
pub async fn follow(
    client: Client,
    skew: ClockSkew,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut was_untrusted = false;
    loop {
        match measure(&client).await {
            Some(s) => {
                skew.record(Some(s));
                metrics.clock_skew.set(s.as_secs_f64());
            }
            None => {
                tracing::debug!("could not measure the clock skew (no Date header or no answer)")
            }
        }
        let untrusted = skew.untrusted();
        match (&untrusted, was_untrusted) {
            (Some(why), false) => tracing::warn!(%why, "time-based evidence refused"),
            (None, true) => tracing::info!("clock skew back within --max-clock-skew"),
            _ => {}
        }
        was_untrusted = untrusted.is_some();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(INTERVAL) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_estimate_is_the_date_plus_half_a_second_against_the_middle_of_the_trip() {
        let sent: Timestamp = "2026-11-28T08:00:00.100Z".parse().unwrap();
        let received: Timestamp = "2026-11-28T08:00:00.300Z".parse().unwrap();
        // Server at 08:00:00.x: +0.5 s against 08:00:00.2 → +0.3 s.
        let s = estimate("Sat, 28 Nov 2026 08:00:00 GMT", sent, received).unwrap();
        assert_eq!(s, SignedDuration::from_millis(300));
        // A server 5 s behind.
        let s = estimate("Sat, 28 Nov 2026 07:59:55 GMT", sent, received).unwrap();
        assert_eq!(s, SignedDuration::from_millis(-4_700));
        assert_eq!(estimate("not a date", sent, received), None);
    }

    #[test]
    fn evidence_is_refused_only_beyond_the_bound() {
        let skew = ClockSkew::new(Duration::from_secs(2));
        assert_eq!(skew.untrusted(), None, "not measured yet");
        skew.record(Some(SignedDuration::from_millis(1_900)));
        assert_eq!(skew.untrusted(), None);
        skew.record(Some(SignedDuration::from_millis(-2_600)));
        let why = skew.untrusted().unwrap();
        assert!(
            why.contains("-2.6s off") && why.contains("--max-clock-skew 2s"),
            "{why}"
        );
    }
}
