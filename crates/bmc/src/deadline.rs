//! Durations from flags, configuration and cluster data, and the deadlines computed from
//! them, without overflow: `Instant + Duration` and `Duration * n` panic on overflow, and a
//! flag like `--request-timeout 18446744073709551615` must be an error message, not a crash.

use std::time::Duration;

use tokio::time::Instant;

/// The longest duration accepted for a timeout, deadline or interval: 365 days. Nothing in
/// powering a host takes longer, and it keeps every `now + d` and `d * n` far from overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// `MAX_DURATION` in words, for messages.
pub const MAX_DURATION_TEXT: &str = "365 days";

/// `duration` if it is at most [`MAX_DURATION`], else an error naming the limit.
pub fn checked_duration(duration: Duration) -> Result<Duration, String> {
    if duration > MAX_DURATION {
        Err(format!(
            "{} is longer than the maximum of {MAX_DURATION_TEXT}",
            describe(duration)
        ))
    } else {
        Ok(duration)
    }
}

/// A duration flag's value as a [`jiff::SignedDuration`] (`30s`, `2m`, `1h30m`, ISO 8601):
/// not negative, at most [`MAX_DURATION`]. For clap's `value_parser`.
pub fn parse_duration_flag(text: &str) -> Result<jiff::SignedDuration, String> {
    let signed: jiff::SignedDuration = text
        .parse()
        .map_err(|e| format!("{text:?} is not a duration like 30s or 2m: {e}"))?;
    let unsigned = Duration::try_from(signed).map_err(|_| format!("{text:?} is negative"))?;
    checked_duration(unsigned)?;
    Ok(signed)
}

/// `now + after`, or the farthest instant that can be represented (never a panic).
pub fn deadline_after(now: Instant, after: Duration) -> Instant {
    now.checked_add(after)
        .or_else(|| now.checked_add(MAX_DURATION))
        .unwrap_or(now)
}

/// `duration * factor`, at most [`MAX_DURATION`] (never a panic).
pub fn scaled(duration: Duration, factor: u32) -> Duration {
    duration.saturating_mul(factor).min(MAX_DURATION)
}

/// `90s`, `2h 5m`, or seconds for values beyond a friendly form.
fn describe(duration: Duration) -> String {
    match jiff::SignedDuration::try_from(duration) {
        Ok(signed) => format!("{signed:#}"),
        Err(_) => format!("{}s", duration.as_secs()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn durations_up_to_the_maximum_are_accepted() {
        assert_eq!(
            checked_duration(Duration::from_secs(30)).unwrap(),
            Duration::from_secs(30)
        );
        assert_eq!(checked_duration(MAX_DURATION).unwrap(), MAX_DURATION);
        let err = checked_duration(Duration::from_secs(u64::MAX)).unwrap_err();
        assert!(err.contains("longer than the maximum of 365 days"), "{err}");
        assert!(checked_duration(Duration::MAX).is_err());
    }

    #[test]
    fn duration_flags() {
        assert_eq!(
            parse_duration_flag("90s").unwrap(),
            jiff::SignedDuration::from_secs(90)
        );
        assert!(parse_duration_flag("-1s").unwrap_err().contains("negative"));
        assert!(
            parse_duration_flag("8785h")
                .unwrap_err()
                .contains("maximum of 365 days")
        );
        assert!(parse_duration_flag("9223372036854775807s").is_err());
        assert!(parse_duration_flag("soon").is_err());
    }

    #[test]
    fn deadlines_never_overflow() {
        let now = Instant::now();
        assert_eq!(
            deadline_after(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
        assert!(deadline_after(now, Duration::MAX) >= now + MAX_DURATION);
        assert!(deadline_after(now, Duration::from_secs(u64::MAX)) > now);
    }

    #[test]
    fn multiples_saturate() {
        assert_eq!(scaled(Duration::from_secs(30), 3), Duration::from_secs(90));
        assert_eq!(scaled(Duration::MAX, 3), MAX_DURATION);
        assert_eq!(scaled(MAX_DURATION, 3), MAX_DURATION);
        assert_eq!(scaled(Duration::from_secs(u64::MAX / 2), 3), MAX_DURATION);
    }
}
