//! Deadlines computed from durations (flags, configuration, cluster data) without overflow:
//! `Instant + Duration` and `Duration * n` panic on overflow. The limit and the flag grammar
//! are `hostcycle_duration`'s, re-exported here.

use std::time::Duration;

use tokio::time::Instant;

pub use hostcycle_duration::{MAX_DURATION, MAX_DURATION_TEXT, checked_duration};

/// A duration flag's value as a [`jiff::SignedDuration`], in the one command-line grammar
/// (`hostcycle_duration`). For clap's `value_parser`.
pub use hostcycle_duration::parse_signed_duration as parse_duration_flag;

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
