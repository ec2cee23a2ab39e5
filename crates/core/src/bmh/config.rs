use std::time::Duration;

/// Timing knobs of [`crate::bmh::decide_with_config`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecideConfig {
    /// Look again this soon while a power transition is pending.
    pub transition_requeue: Duration,
    /// Steady-state re-check interval (catches power changed behind our back).
    pub steady_requeue: Duration,
    /// Re-check interval while the BMC reports an unknown power state.
    pub unknown_power_requeue: Duration,
    /// A soft power-off still not observed after this long is carried out hard
    /// (the host ignored the ACPI shutdown).
    pub soft_power_off_timeout: Duration,
    /// A requested power change (power-on or hard power-off) not observed within this long may
    /// be requested again. Should exceed `soft_power_off_timeout`.
    pub power_action_timeout: Duration,
    /// First retry delay after an error; doubles with every consecutive error.
    pub error_backoff_base: Duration,
    /// Upper bound of the error backoff.
    pub error_backoff_max: Duration,
}

impl Default for DecideConfig {
    fn default() -> Self {
        Self {
            transition_requeue: Duration::from_secs(1),
            steady_requeue: Duration::from_secs(60),
            unknown_power_requeue: Duration::from_secs(10),
            soft_power_off_timeout: Duration::from_secs(180),
            power_action_timeout: Duration::from_secs(300),
            error_backoff_base: Duration::from_secs(5),
            error_backoff_max: Duration::from_secs(300),
        }
    }
}

impl DecideConfig {
    /// Delay before retrying after `error_count` consecutive errors (1 → base).
    pub fn error_backoff(&self, error_count: u32) -> Duration {
        let doublings = error_count.saturating_sub(1).min(20);
        self.error_backoff_base
            .saturating_mul(1_u32 << doublings)
            .min(self.error_backoff_max)
    }
}
