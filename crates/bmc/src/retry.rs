//! Retries with exponential backoff for transient BMC failures, within a deadline.
//!
//! A BMC that answers 503 with `Retry-After` gets the delay it asked for (capped). Permanent
//! failures return at once. The whole call, retries included, never outlives the deadline.

use std::future::Future;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::time::Instant;

use crate::deadline::deadline_after;
use crate::error::BmcError;

/// How one BMC call is retried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included.
    pub max_attempts: u32,
    /// Delay before the second attempt; doubles each time, with jitter.
    pub initial_backoff: Duration,
    /// Longest delay between attempts.
    pub max_backoff: Duration,
    /// Longest Retry-After honoured; a BMC asking for more gets this.
    pub max_retry_after: Duration,
    /// Deadline for the whole call, retries included.
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(30),
            deadline: Duration::from_secs(120),
        }
    }
}

impl RetryPolicy {
    /// A policy that tries once, with the given deadline.
    pub fn no_retries(deadline: Duration) -> Self {
        RetryPolicy {
            max_attempts: 1,
            deadline,
            ..RetryPolicy::default()
        }
    }
}

/// Runs `attempt` until it succeeds, fails permanently, runs out of attempts or hits the
/// deadline. `operation` names the call in errors and logs ("GET https://bmc/redfish/v1/...").
pub async fn with_retries<T, F, Fut>(
    policy: &RetryPolicy,
    operation: &str,
    mut attempt: F,
) -> Result<T, BmcError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, BmcError>>,
{
    let start = Instant::now();
    let deadline = deadline_after(start, policy.deadline);
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(policy.initial_backoff)
        .with_max_delay(policy.max_backoff)
        .with_max_times(policy.max_attempts.saturating_sub(1) as usize)
        .with_jitter()
        .build();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let result = match tokio::time::timeout_at(deadline, attempt()).await {
            Ok(result) => result,
            Err(_) => {
                return Err(BmcError::Timeout {
                    what: operation.to_string(),
                    after: policy.deadline,
                });
            }
        };
        let error = match result {
            Ok(value) => return Ok(value),
            Err(error) if !error.is_transient() => return Err(error),
            Err(error) => error,
        };
        let give_up = |error: BmcError| BmcError::RetriesExhausted {
            operation: operation.to_string(),
            attempts,
            elapsed: start.elapsed(),
            last: Box::new(error),
        };
        let Some(mut delay) = delays.next() else {
            return Err(if attempts == 1 { error } else { give_up(error) });
        };
        if let Some(asked) = error.retry_after() {
            delay = delay.max(asked.min(policy.max_retry_after));
        }
        if deadline_after(Instant::now(), delay) >= deadline {
            return Err(give_up(error));
        }
        tracing::warn!(
            operation,
            attempt = attempts,
            retry_in_ms = delay.as_millis() as u64,
            // Cut: the error may carry a path or text the BMC sent.
            error = %crate::text::clip(&error.to_string()),
            "transient BMC failure; retrying"
        );
        tokio::time::sleep(delay).await;
    }
}

/// Parses a Retry-After header value: delay-seconds or an HTTP date.
pub fn parse_retry_after(value: &str, now: jiff::Timestamp) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let when = jiff::fmt::rfc2822::parse(value).ok()?.timestamp();
    let delta = when.duration_since(now);
    Some(Duration::try_from(delta).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn transient() -> BmcError {
        BmcError::Http {
            endpoint: "e".into(),
            method: "GET".into(),
            path: "/".into(),
            status: 503,
            message: String::new(),
            retry_after: None,
        }
    }

    fn fast_policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
            max_retry_after: Duration::from_millis(50),
            deadline: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn retries_transient_errors_until_success() {
        let calls = AtomicU32::new(0);
        let result = with_retries(&fast_policy(), "op", || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(transient())
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(result.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn permanent_errors_are_not_retried() {
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = with_retries(&fast_policy(), "op", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(BmcError::AuthenticationFailed {
                endpoint: "e".into(),
                detail: "401".into(),
            })
        })
        .await;
        assert!(matches!(result, Err(BmcError::AuthenticationFailed { .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn gives_up_after_max_attempts_naming_the_operation() {
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = with_retries(&fast_policy(), "GET /x", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(transient())
        })
        .await;
        let err = result.unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert!(
            err.to_string()
                .contains("GET /x still failing after 4 attempts"),
            "{err}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn honours_retry_after_up_to_the_cap() {
        let calls = AtomicU32::new(0);
        let policy = RetryPolicy {
            max_retry_after: Duration::from_secs(3),
            initial_backoff: Duration::from_millis(1),
            ..RetryPolicy::default()
        };
        let start = Instant::now();
        let result = with_retries(&policy, "op", || async {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                let mut e = transient();
                if let BmcError::Http { retry_after, .. } = &mut e {
                    *retry_after = Some(Duration::from_secs(3600));
                }
                Err(e)
            } else {
                Ok(())
            }
        })
        .await;
        assert!(result.is_ok());
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(3) && waited < Duration::from_secs(4),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_bounds_a_hanging_attempt() {
        let policy = RetryPolicy {
            deadline: Duration::from_secs(2),
            ..fast_policy()
        };
        let result: Result<(), _> = with_retries(&policy, "GET /slow", || async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(())
        })
        .await;
        let err = result.unwrap_err();
        assert!(matches!(err, BmcError::Timeout { .. }));
        assert_eq!(err.to_string(), "timed out after 2s waiting for GET /slow");
    }

    #[test]
    fn retry_after_formats() {
        let now: jiff::Timestamp = "2024-03-01T12:00:00Z".parse().unwrap();
        assert_eq!(parse_retry_after("5", now), Some(Duration::from_secs(5)));
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Fri, 01 Mar 2024 12:00:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Fri, 01 Mar 2024 11:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
    }
}
