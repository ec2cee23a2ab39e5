//! The one grammar for durations on the command line, and the limit every duration (flags,
//! settings, deadlines) shares: a bare number of seconds (`30`), `30s`, `2m`, `1h30m`,
//! `1m 30s` or ISO 8601 (`PT30S`); never negative, at most [`MAX_DURATION`].
//!
//! The limit keeps every `now + d` and `d * n` far from overflow: a flag like
//! `--request-timeout 18446744073709551615` is an error message, not a crash.

use std::time::Duration;

/// The longest duration accepted for a timeout, deadline or interval: 365 days. Nothing in
/// powering a host takes longer, and it keeps every `now + d` and `d * n` far from overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// `MAX_DURATION` in words, for messages.
pub const MAX_DURATION_TEXT: &str = "365 days";

/// Why a duration is refused; the message names the text or the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("{text:?} is not a duration like 30s or 2m: {reason}")]
    NotADuration { text: String, reason: String },
    #[error("{text:?} is negative")]
    Negative { text: String },
    /// `duration` as [`describe`] writes it.
    #[error("{duration} is longer than the maximum of {MAX_DURATION_TEXT}")]
    TooLong { duration: String },
}

/// `duration` if it is at most [`MAX_DURATION`], else an error naming the limit.
pub fn checked_duration(duration: Duration) -> Result<Duration, DurationError> {
    if duration > MAX_DURATION {
        Err(DurationError::TooLong {
            duration: describe(duration),
        })
    } else {
        Ok(duration)
    }
}

/// A command-line duration (the grammar of this crate's documentation). For clap's
/// `value_parser`.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let duration = match text.trim().parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => {
            let signed: jiff::SignedDuration =
                text.parse()
                    .map_err(|e: jiff::Error| DurationError::NotADuration {
                        text: text.to_string(),
                        reason: e.to_string(),
                    })?;
            Duration::try_from(signed).map_err(|_| DurationError::Negative {
                text: text.to_string(),
            })?
        }
    };
    checked_duration(duration)
}

/// [`parse_duration`], as a [`jiff::SignedDuration`] (exact: every accepted value fits).
pub fn parse_signed_duration(text: &str) -> Result<jiff::SignedDuration, DurationError> {
    let duration = parse_duration(text)?;
    jiff::SignedDuration::try_from(duration).map_err(|_| DurationError::TooLong {
        duration: describe(duration),
    })
}

/// `90s`, `2h 5m`, or seconds for values beyond a friendly form.
pub fn describe(duration: Duration) -> String {
    match jiff::SignedDuration::try_from(duration) {
        Ok(signed) => format!("{signed:#}"),
        Err(_) => format!("{}s", duration.as_secs()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn durations_up_to_the_maximum_are_accepted() {
        assert_eq!(checked_duration(secs(30)).unwrap(), secs(30));
        assert_eq!(checked_duration(MAX_DURATION).unwrap(), MAX_DURATION);
        let err = checked_duration(secs(u64::MAX)).unwrap_err().to_string();
        assert!(err.contains("longer than the maximum of 365 days"), "{err}");
        assert!(checked_duration(Duration::MAX).is_err());
    }

    #[test]
    fn a_bare_number_is_seconds() {
        assert_eq!(parse_duration("30").unwrap(), secs(30));
        assert_eq!(parse_duration(" 30 ").unwrap(), secs(30));
        assert_eq!(parse_duration("0").unwrap(), secs(0));
        assert_eq!(parse_duration("31536000").unwrap(), MAX_DURATION);
    }

    #[test]
    fn units_and_iso_8601() {
        assert_eq!(parse_duration("30s").unwrap(), secs(30));
        assert_eq!(parse_duration("2m").unwrap(), secs(120));
        assert_eq!(parse_duration("1h30m").unwrap(), secs(5400));
        assert_eq!(parse_duration("1m 30s").unwrap(), secs(90));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("PT30S").unwrap(), secs(30));
        assert_eq!(parse_duration("PT1H").unwrap(), secs(3600));
        assert_eq!(parse_duration("8760h").unwrap(), MAX_DURATION);
    }

    #[test]
    fn negative_values_are_refused() {
        for text in ["-5s", "-1s", "-PT1S"] {
            let err = parse_duration(text).unwrap_err();
            assert_eq!(
                err,
                DurationError::Negative {
                    text: text.to_string()
                }
            );
            assert!(err.to_string().contains("negative"), "{err}");
        }
        // A negative bare number is not a number of seconds (u64), nor a duration.
        assert!(parse_duration("-5").is_err());
    }

    #[test]
    fn more_than_365_days_is_refused() {
        for text in [
            "31536001",
            "18446744073709551615",
            "8785h",
            "8760h 1s",
            "PT8761H",
        ] {
            let err = parse_duration(text).unwrap_err().to_string();
            assert!(
                err.contains("longer than the maximum of 365 days"),
                "{text}: {err}"
            );
        }
        // Beyond what a duration can hold: refused, not a panic.
        for text in [
            "18446744073709551615s",
            "9223372036854775807s",
            "PT876000000000H",
        ] {
            assert!(parse_duration(text).is_err(), "{text}");
        }
    }

    #[test]
    fn garbage_is_refused_with_a_message_naming_the_text() {
        for text in ["soon", "", "30x", "s30", "1.2.3s"] {
            let err = parse_duration(text).unwrap_err();
            assert!(
                matches!(err, DurationError::NotADuration { .. }),
                "{text}: {err:?}"
            );
            let message = err.to_string();
            assert!(message.contains(&format!("{text:?}")), "{message}");
            assert!(
                message.contains("not a duration like 30s or 2m"),
                "{message}"
            );
        }
    }

    #[test]
    fn the_signed_shape_is_the_same_value() {
        assert_eq!(
            parse_signed_duration("90s").unwrap(),
            jiff::SignedDuration::from_secs(90)
        );
        assert_eq!(
            parse_signed_duration("30").unwrap(),
            jiff::SignedDuration::from_secs(30)
        );
        assert!(
            parse_signed_duration("-1s")
                .unwrap_err()
                .to_string()
                .contains("negative")
        );
        assert!(
            parse_signed_duration("8785h")
                .unwrap_err()
                .to_string()
                .contains("maximum of 365 days")
        );
        assert!(parse_signed_duration("9223372036854775807s").is_err());
        assert!(parse_signed_duration("soon").is_err());
    }

    #[test]
    fn descriptions_are_friendly() {
        assert_eq!(describe(secs(90)), "1m 30s");
        assert_eq!(describe(Duration::MAX), format!("{}s", u64::MAX));
    }
}
