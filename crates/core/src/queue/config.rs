//! The queue's effective configuration: `RebootQueue.spec` with every default filled in.

use std::time::Duration;

use hostcycle_api::queue::{
    DEFAULT_BOOT_CHECK_INTERVAL_SECONDS, DEFAULT_COMMAND_TIMEOUT_SECONDS,
    DEFAULT_DRAIN_BACKOFF_BASE_SECONDS, DEFAULT_DRAIN_BACKOFF_JITTER_SECONDS,
    DEFAULT_DRAIN_BACKOFF_MAX_SECONDS, DEFAULT_EVICTION_TIMEOUT_SECONDS,
    DEFAULT_MAX_CONCURRENT_REBOOTS, DEFAULT_MAX_UNREACHABLE_NODES, RebootMethod, RebootQueueSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::commands::{CommandSet, CommandSets};

/// `RebootQueue.spec` resolved: what the controller and `plan` actually use.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    pub enabled: bool,
    pub max_concurrent_reboots: u32,
    pub max_unreachable_nodes: u32,
    pub eviction_timeout: Duration,
    pub evict_retries: u32,
    pub evict_interval: Duration,
    /// `None`: every namespace is protected.
    pub protected_namespaces: Option<LabelSelector>,
    /// `None`: every Job pod is protected.
    pub protected_job_pods: Option<LabelSelector>,
    pub backoff: BackoffConfig,
    pub reboot: RebootConfig,
}

/// Drain backoff: `min(2^(n-1) * base, max) + random[0, jitter)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    pub base: Duration,
    pub max: Duration,
    pub jitter: Duration,
}

/// Reboot and boot-check settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebootConfig {
    /// `None`: BMC when the node has a BareMetalHost, else Command when the selected
    /// command set is configured.
    pub method: Option<RebootMethod>,
    /// The command set `Command` runs, from the operator's configuration; `Err` says why
    /// there is none (for a queue user to read: it never quotes a command).
    pub commands: Result<CommandSet, String>,
    /// `None`: commands run until they end (`commandTimeoutSeconds: 0`, as CKE's
    /// `command_timeout_seconds: 0`); `bootTimeoutSeconds` still raises its Warning.
    pub command_timeout: Option<Duration>,
    pub command_retries: u32,
    pub command_interval: Duration,
    pub boot_check_interval: Duration,
    pub boot_timeout: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig::from_spec(&RebootQueueSpec::default())
    }
}

impl QueueConfig {
    /// Resolves a spec without the operator's command sets (an offline plan); an absent
    /// `RebootQueue` is `RebootQueueSpec::default()`.
    pub fn from_spec(spec: &RebootQueueSpec) -> Self {
        QueueConfig::resolve(spec, &CommandSets::Unknown)
    }

    /// Resolves a spec with the operator's command sets: the spec only names one.
    pub fn resolve(spec: &RebootQueueSpec, command_sets: &CommandSets) -> Self {
        let backoff = spec.drain_backoff.clone().unwrap_or_default();
        let reboot = spec.reboot.clone().unwrap_or_default();
        QueueConfig {
            enabled: spec.enabled.unwrap_or(true),
            max_concurrent_reboots: spec
                .max_concurrent_reboots
                .unwrap_or(DEFAULT_MAX_CONCURRENT_REBOOTS)
                .max(1),
            max_unreachable_nodes: spec
                .max_unreachable_nodes
                .unwrap_or(DEFAULT_MAX_UNREACHABLE_NODES),
            eviction_timeout: secs(
                spec.eviction_timeout_seconds
                    .unwrap_or(DEFAULT_EVICTION_TIMEOUT_SECONDS)
                    .max(1),
            ),
            evict_retries: spec.evict_retries.unwrap_or(0),
            evict_interval: secs(spec.evict_interval_seconds.unwrap_or(0)),
            protected_namespaces: spec.protected_namespaces.clone(),
            protected_job_pods: spec.protected_job_pods.clone(),
            backoff: BackoffConfig {
                base: secs(
                    backoff
                        .base_seconds
                        .unwrap_or(DEFAULT_DRAIN_BACKOFF_BASE_SECONDS),
                ),
                max: secs(
                    backoff
                        .max_seconds
                        .unwrap_or(DEFAULT_DRAIN_BACKOFF_MAX_SECONDS),
                ),
                jitter: secs(
                    backoff
                        .jitter_seconds
                        .unwrap_or(DEFAULT_DRAIN_BACKOFF_JITTER_SECONDS),
                ),
            },
            reboot: RebootConfig {
                method: reboot.method,
                commands: command_sets
                    .select(reboot.commands.as_deref())
                    .map_err(|why| with_legacy_note(why, &reboot)),
                command_timeout: match reboot
                    .command_timeout_seconds
                    .unwrap_or(DEFAULT_COMMAND_TIMEOUT_SECONDS)
                {
                    0 => None,
                    seconds => Some(secs(seconds)),
                },
                command_retries: reboot.command_retries.unwrap_or(0),
                command_interval: secs(reboot.command_interval_seconds.unwrap_or(0)),
                boot_check_interval: secs(
                    reboot
                        .boot_check_interval_seconds
                        .unwrap_or(DEFAULT_BOOT_CHECK_INTERVAL_SECONDS)
                        .max(1),
                ),
                boot_timeout: secs(spec.boot_timeout_seconds()),
            },
        }
    }
}

/// `why` there is no command set, telling a queue that still carries the commands older
/// versions ran from its spec that they are no longer run.
fn with_legacy_note(why: String, reboot: &hostcycle_api::queue::RebootSpec) -> String {
    if reboot.reboot_command.is_empty() && reboot.boot_check_command.is_empty() {
        return why;
    }
    format!(
        "{why}; spec.reboot.rebootCommand and bootCheckCommand are no longer run (whoever may \
         write the RebootQueue must not choose what the operator runs): see \
         docs/reboot-queue.md#commands"
    )
}

/// Seconds from the API, capped so that adding them to a timestamp can never overflow.
fn secs(n: u64) -> Duration {
    // 100 years: far beyond any sensible setting, far below jiff's range.
    Duration::from_secs(n.min(100 * 365 * 24 * 3600))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hostcycle_api::queue::{DrainBackoffSpec, RebootSpec};

    #[test]
    fn absent_spec_means_documented_defaults() {
        let c = QueueConfig::default();
        assert!(c.enabled);
        assert_eq!(c.max_concurrent_reboots, 1);
        assert_eq!(c.max_unreachable_nodes, 0);
        assert_eq!(c.eviction_timeout, Duration::from_secs(600));
        assert_eq!((c.evict_retries, c.evict_interval), (0, Duration::ZERO));
        assert_eq!(c.protected_namespaces, None);
        assert_eq!(c.protected_job_pods, None);
        assert_eq!(
            c.backoff,
            BackoffConfig {
                base: Duration::from_secs(300),
                max: Duration::from_secs(1200),
                jitter: Duration::from_secs(300)
            }
        );
        assert_eq!(c.reboot.method, None);
        assert_eq!(c.reboot.command_timeout, Some(Duration::from_secs(30)));
        assert_eq!(c.reboot.boot_timeout, Duration::from_secs(1800));
    }

    #[test]
    fn given_fields_win_and_nonsense_is_clamped() {
        let spec = RebootQueueSpec {
            enabled: Some(false),
            max_concurrent_reboots: Some(0),
            eviction_timeout_seconds: Some(u64::MAX),
            drain_backoff: Some(DrainBackoffSpec {
                base_seconds: Some(1),
                max_seconds: None,
                jitter_seconds: Some(0),
            }),
            reboot: Some(RebootSpec {
                method: Some(RebootMethod::Command),
                command_retries: Some(2),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = QueueConfig::from_spec(&spec);
        assert!(!c.enabled);
        assert_eq!(
            c.max_concurrent_reboots, 1,
            "0 would stop the queue forever"
        );
        assert!(c.eviction_timeout < Duration::from_secs(u64::MAX));
        assert_eq!(c.backoff.base, Duration::from_secs(1));
        assert_eq!(c.backoff.max, Duration::from_secs(1200));
        assert_eq!(c.reboot.method, Some(RebootMethod::Command));
        assert_eq!(c.reboot.command_retries, 2);
    }

    /// The RebootQueue names a command set at most: commands written into its spec (as older
    /// versions ran them) never reach the config, and a queue carrying them is told why.
    #[test]
    fn commands_come_only_from_the_operators_command_sets() {
        let legacy = RebootQueueSpec {
            reboot: Some(RebootSpec {
                method: Some(RebootMethod::Command),
                reboot_command: vec!["/tmp/attacker.sh".into()],
                boot_check_command: vec!["/tmp/attacker.sh".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let why = QueueConfig::resolve(&legacy, &CommandSets::Absent)
            .reboot
            .commands
            .unwrap_err();
        assert!(why.contains("no longer run"), "{why}");
        assert!(!why.contains("attacker"), "{why}");

        let data = [(
            "default".to_string(),
            "rebootCommand: [/usr/local/bin/reboot-node]\nbootCheckCommand: [/usr/local/bin/booted]\n"
                .to_string(),
        )]
        .into_iter()
        .collect();
        let sets = CommandSets::from_config_map_data(Some(&data));
        let set = QueueConfig::resolve(&legacy, &sets)
            .reboot
            .commands
            .unwrap();
        assert_eq!(set.reboot, vec!["/usr/local/bin/reboot-node".to_string()]);
        assert_eq!(set.boot_check, vec!["/usr/local/bin/booted".to_string()]);

        let named = RebootQueueSpec {
            reboot: Some(RebootSpec {
                commands: Some("ipmi".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let why = QueueConfig::resolve(&named, &sets)
            .reboot
            .commands
            .unwrap_err();
        assert!(why.contains("\"ipmi\" is not in ConfigMap"), "{why}");
    }

    /// `commandTimeoutSeconds: 0` is CKE's "no timeout"; absent is the 30 s default.
    #[test]
    fn a_zero_command_timeout_means_none() {
        let with = |seconds: Option<u64>| {
            QueueConfig::from_spec(&RebootQueueSpec {
                reboot: Some(RebootSpec {
                    command_timeout_seconds: seconds,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .reboot
            .command_timeout
        };
        assert_eq!(with(Some(0)), None);
        assert_eq!(with(None), Some(Duration::from_secs(30)));
        assert_eq!(with(Some(1)), Some(Duration::from_secs(1)));
        assert!(with(Some(u64::MAX)).is_some_and(|t| t < Duration::from_secs(u64::MAX)));
    }
}
