//! Per-object exponential backoff for failed reconciles.
//!
//! Every reconcile error (a status write the API server refused, an annotation patch, a
//! conflict) waits `base · 2^(failures-1)`, capped, plus a bounded random jitter so a fleet of
//! hosts failing together does not retry in lockstep. A successful reconcile resets the count.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

/// How soon a loop controller (reboot queue, remediation) looks again after a failed write, a
/// conflict or a failed action.
pub const RETRY_SOON: Duration = Duration::from_secs(1);

/// Delays for consecutive failures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorBackoff {
    /// Delay after the first failure.
    pub base: Duration,
    /// Largest delay before jitter.
    pub cap: Duration,
    /// Jitter as a fraction of the delay (0.25: up to 25 % added).
    pub jitter: f64,
}

impl ErrorBackoff {
    /// Reconcile errors: 1 s, 2 s, 4 s ... 5 min.
    pub const ERRORS: ErrorBackoff = ErrorBackoff {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(300),
        jitter: 0.25,
    };
    /// The API server unreachable: 1 s, 2 s, 4 s, 5 s ... An exponential delay would grow
    /// with the outage — after a 5-minute one, a requested reboot would wait up to 5 more
    /// minutes once the server is back; this one goes ahead within seconds. Only hosts with a
    /// status to write retry (steady hosts write nothing), so the retries stay few.
    pub const API_UNREACHABLE: ErrorBackoff = ErrorBackoff {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(5),
        jitter: 0.25,
    };
    /// A watch reconnecting: 500 ms, 1 s, 2 s, 4 s, then every 5 s. kube's default grows to
    /// 30 s, so after an API server outage the caches the queue and remediation decide from
    /// could stay stale for half a minute; a watch is one request per resource, cheap to
    /// retry every few seconds.
    pub const WATCH: ErrorBackoff = ErrorBackoff {
        base: Duration::from_millis(500),
        cap: Duration::from_secs(5),
        jitter: 0.25,
    };
    /// Conflicts (the cache lagged one of our writes): 100 ms, 200 ms ... 10 s.
    pub const CONFLICTS: ErrorBackoff = ErrorBackoff {
        base: Duration::from_millis(100),
        cap: Duration::from_secs(10),
        jitter: 0.25,
    };

    /// Delay after `failures` consecutive failures (1 = the first), with `random` in `[0, 1)`
    /// choosing the jitter. Never more than `cap · (1 + jitter)`; 0 failures is no delay.
    pub fn delay(&self, failures: u32, random: f64) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let doublings = failures.saturating_sub(1).min(63);
        let factor = 1u64.checked_shl(doublings).unwrap_or(u64::MAX);
        let factor = u32::try_from(factor).unwrap_or(u32::MAX);
        let delay = self.base.saturating_mul(factor).min(self.cap);
        let fraction = |x: f64| {
            if x.is_finite() {
                x.clamp(0.0, 1.0)
            } else {
                0.0
            }
        };
        let jitter = fraction(self.jitter) * fraction(random);
        let extra = Duration::try_from_secs_f64(delay.as_secs_f64() * jitter).unwrap_or(delay);
        delay.saturating_add(extra)
    }
}

/// Reconnect delays of the operator's watches ([`ErrorBackoff::WATCH`]), for
/// `WatchStreamExt::backoff`; the stream resets it at every event that is not an error.
#[derive(Debug, Default)]
pub struct WatchBackoff {
    failures: u32,
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.failures = self.failures.saturating_add(1);
        Some(ErrorBackoff::WATCH.delay(self.failures, rand::random::<f64>()))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.failures = 0;
    }
}

/// Consecutive failures per key (a host).
#[derive(Debug)]
pub struct FailureCounts<K> {
    counts: Mutex<HashMap<K, u32>>,
}

impl<K> Default for FailureCounts<K> {
    fn default() -> Self {
        FailureCounts {
            counts: Mutex::default(),
        }
    }
}

impl<K: Eq + Hash> FailureCounts<K> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, u32>> {
        match self.counts.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Counts one more failure of `key`; returns the count.
    pub fn failed(&self, key: K) -> u32 {
        let mut counts = self.lock();
        let count = counts.entry(key).or_default();
        *count = count.saturating_add(1);
        *count
    }

    /// `key` succeeded: the next failure starts from the base delay again.
    pub fn succeeded(&self, key: &K) {
        self.lock().remove(key);
    }

    pub fn failures(&self, key: &K) -> u32 {
        self.lock().get(key).copied().unwrap_or(0)
    }

    /// Forgets the counts of keys that no longer exist (deleted hosts).
    pub fn retain(&self, mut exists: impl FnMut(&K) -> bool) {
        self.lock().retain(|key, _| exists(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn counts_of_deleted_keys_are_forgotten() {
        let counts = FailureCounts::default();
        for key in ["a", "b", "b", "c"] {
            counts.failed(key);
        }
        counts.retain(|key| *key != "b");
        assert_eq!(
            (
                counts.failures(&"a"),
                counts.failures(&"b"),
                counts.failures(&"c")
            ),
            (1, 0, 1)
        );
    }

    #[test]
    fn doubles_from_the_base_up_to_the_cap() {
        let b = ErrorBackoff {
            base: ms(1000),
            cap: ms(300_000),
            jitter: 0.25,
        };
        #[rustfmt::skip]
        let cases = [
            (0, 0.0, ms(0)),
            (1, 0.0, ms(1000)),
            (2, 0.0, ms(2000)),
            (3, 0.0, ms(4000)),
            (9, 0.0, ms(256_000)),
            (10, 0.0, ms(300_000)),
            (64, 0.0, ms(300_000)),
            (u32::MAX, 0.0, ms(300_000)),
            (1, 0.5, ms(1125)),
            (3, 0.999_999, ms(4999)),
            (u32::MAX, 0.999_999, ms(374_999)),
        ];
        for (failures, random, want) in cases {
            let got = b.delay(failures, random);
            assert!(
                got.abs_diff(want) < ms(1),
                "delay({failures}, {random}) = {got:?}, want {want:?}"
            );
        }
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        for backoff in [
            ErrorBackoff::ERRORS,
            ErrorBackoff::CONFLICTS,
            ErrorBackoff::API_UNREACHABLE,
            ErrorBackoff::WATCH,
        ] {
            for failures in 1..40 {
                let floor = backoff.delay(failures, 0.0);
                for i in 0..100 {
                    let random = f64::from(i) / 100.0;
                    let got = backoff.delay(failures, random);
                    assert!(got >= floor, "{got:?} < {floor:?}");
                    assert!(got <= floor.mul_f64(1.0 + backoff.jitter), "{got:?}");
                    assert!(got <= backoff.cap.mul_f64(1.0 + backoff.jitter));
                }
            }
        }
        // Out-of-range inputs are clamped, never a panic.
        let wild = ErrorBackoff {
            base: Duration::MAX,
            cap: Duration::MAX,
            jitter: 7.0,
        };
        assert_eq!(wild.delay(u32::MAX, 3.0), Duration::MAX);
        assert_eq!(ErrorBackoff::ERRORS.delay(1, -1.0), ms(1000));
    }

    #[test]
    fn watches_reconnect_within_seconds_and_start_over_after_an_event() {
        use kube::runtime::utils::Backoff;
        let mut backoff = WatchBackoff::default();
        let delays: Vec<Duration> = backoff.by_ref().take(30).collect();
        assert!(delays[0] >= ms(500) && delays[0] <= ms(625), "{delays:?}");
        assert!(delays.iter().all(|d| *d <= ms(6250)), "{delays:?}");
        backoff.reset();
        assert!(backoff.next().is_some_and(|d| d <= ms(625)));
    }

    #[test]
    fn a_success_resets_the_count() {
        let counts = FailureCounts::<&str>::default();
        assert_eq!(counts.failed("a"), 1);
        assert_eq!(counts.failed("a"), 2);
        assert_eq!(counts.failed("b"), 1);
        assert_eq!(counts.failed("a"), 3);
        let grown = ErrorBackoff::ERRORS.delay(counts.failures(&"a"), 0.0);
        assert_eq!(grown, ms(4000));
        counts.succeeded(&"a");
        assert_eq!(counts.failures(&"a"), 0);
        assert_eq!(counts.failed("a"), 1);
        assert_eq!(ErrorBackoff::ERRORS.delay(1, 0.0), ms(1000));
        assert_eq!(counts.failures(&"b"), 1, "other hosts keep their count");
    }
}
