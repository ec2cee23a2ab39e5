//! Time arithmetic every controller's decisions share: saturating, never panicking.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

/// `t + d`, saturating at jiff's maximum.
pub fn add(t: Timestamp, d: Duration) -> Timestamp {
    SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

/// `now - since`, zero when `since` is in the future.
pub fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO)
}

/// `t` truncated to whole seconds, the precision of a `metav1.Time` on the wire, so a
/// written status round-trips unchanged.
pub fn wire_precision(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}
