//! The command driver, compatible with CKE's reboot settings: for clusters that reboot hosts
//! with their own tooling.
//!
//! - reboot: `reboot_command… <node>`
//! - boot check: `boot_check_command… <node> <unix-time>`; the node counts as booted after
//!   that time only when the command exits 0 and prints `true`.
//!
//! A node starting with `-` is refused when the driver is made: it would be read as an
//! option. (The reboot queue accepts only IP addresses and DNS names.)
//!
//! Commands run without a shell, with a timeout unless none is configured; the child is
//! killed on timeout or drop.
//! They get a cleared environment holding only [`COMMAND_ENVIRONMENT`] (the operator's own
//! variables may hold secrets), and at most 64 KiB of each output stream is kept.
//! The driver can reboot and tell whether a reboot finished; it cannot power on or off.

use std::fmt;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;

use crate::bounded::{MAX_CHILD_OUTPUT_BYTES, wait_with_capped_output};
use crate::driver::{
    DriverDescription, DriverKind, PowerDriver, PowerOffMode, PowerOutcome, PowerRequest,
    PowerState,
};
use crate::error::BmcError;
use crate::text;

/// The only variables a command inherits from the operator: where programs are, the home
/// directory (ssh keys, tools' configuration), locale and time zone. Anything else a
/// command needs (a kubeconfig, a token file) goes into its argv or its script.
pub const COMMAND_ENVIRONMENT: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ"];

/// The variables of `names` that are set in this process, to hand to a child whose
/// environment was cleared.
pub(crate) fn inherited_environment(names: &[&str]) -> Vec<(String, std::ffi::OsString)> {
    names
        .iter()
        .filter_map(|name| std::env::var_os(name).map(|value| (name.to_string(), value)))
        .collect()
}

/// The cluster's reboot tooling.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CommandDriverConfig {
    /// argv of the reboot command; the node is appended.
    pub reboot_command: Vec<String>,
    /// argv of the boot check; the node and a Unix time are appended.
    pub boot_check_command: Vec<String>,
    /// Kill a command after this long; `None`: let it run until it ends (CKE's
    /// `command_timeout_seconds: 0`). In seconds when serialized, `0` meaning `None`.
    #[serde(with = "timeout_secs")]
    pub command_timeout: Option<Duration>,
}

mod timeout_secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.map_or(0, |d| d.as_secs()))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        u64::deserialize(d).map(|secs| (secs > 0).then(|| Duration::from_secs(secs)))
    }
}

/// What a command printed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandOutput {
    /// `exit status: 0`, `signal: 9 (SIGKILL)`...
    pub status: String,
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl CommandOutput {
    /// stdout and stderr together, trimmed, for events.
    pub fn combined(&self) -> String {
        [self.stdout.trim(), self.stderr.trim()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Reboots one node with the cluster's commands.
pub struct CommandDriver {
    config: CommandDriverConfig,
    node: String,
    /// When this driver last started a reboot; the boot check asks about boots after it.
    reboot_started: Mutex<Option<Timestamp>>,
}

impl fmt::Debug for CommandDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandDriver")
            .field("node", &self.node)
            .field("reboot_command", &self.config.reboot_command)
            .field("boot_check_command", &self.config.boot_check_command)
            .finish_non_exhaustive()
    }
}

impl CommandDriver {
    pub fn new(config: CommandDriverConfig, node: impl Into<String>) -> Result<Self, BmcError> {
        let node = node.into();
        if config.reboot_command.first().is_none_or(|p| p.is_empty()) {
            return Err(BmcError::Config("the reboot command is empty".into()));
        }
        if config
            .boot_check_command
            .first()
            .is_none_or(|p| p.is_empty())
        {
            return Err(BmcError::Config("the boot check command is empty".into()));
        }
        if node.trim().is_empty() {
            return Err(BmcError::Config(
                "the command driver needs a node name".into(),
            ));
        }
        // The node is appended to the commands' argv: ssh-like tools read an argument
        // starting with `-` as an option (`-oProxyCommand=…` runs a command).
        if node.starts_with('-') {
            return Err(BmcError::Config(format!(
                "the node {:?} starts with '-': the commands would read it as an option; they \
                 are not run with it (give an IP address or a DNS name)",
                text::clip_to(&node, 64)
            )));
        }
        // A zero deadline would kill every command at once; "no deadline" is `None`.
        if config.command_timeout.is_some_and(|t| t.is_zero()) {
            return Err(BmcError::Config(
                "the command timeout must be positive (no timeout: leave it unset)".into(),
            ));
        }
        Ok(CommandDriver {
            config,
            node,
            reboot_started: Mutex::new(None),
        })
    }

    /// Runs the reboot command for the node. Errors when it fails or times out.
    pub async fn run_reboot(&self) -> Result<CommandOutput, BmcError> {
        let started = Timestamp::now();
        let output = run(
            &self.config.reboot_command,
            &[&self.node],
            self.config.command_timeout,
        )
        .await?;
        if !output.success {
            return Err(command_failed(
                &self.config.reboot_command,
                &self.node,
                &output,
            ));
        }
        match self.reboot_started.lock() {
            Ok(mut slot) => *slot = Some(started),
            Err(poisoned) => *poisoned.into_inner() = Some(started),
        }
        Ok(output)
    }

    /// Whether the node has booted after `since`: exit 0 and `true` on stdout. A non-zero
    /// exit means "not (yet)"; only failing to run the command at all is an error.
    pub async fn booted_since(&self, since: Timestamp) -> Result<bool, BmcError> {
        let seconds = since.as_second().to_string();
        let output = run(
            &self.config.boot_check_command,
            &[&self.node, &seconds],
            self.config.command_timeout,
        )
        .await?;
        Ok(output.success && output.stdout.trim() == "true")
    }

    /// When this driver last started a reboot.
    pub fn reboot_started(&self) -> Option<Timestamp> {
        match self.reboot_started.lock() {
            Ok(slot) => *slot,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    fn unsupported(&self, operation: &str) -> BmcError {
        BmcError::Unsupported {
            driver: self.description().to_string(),
            operation: operation.to_string(),
            reason: "the command driver can only reboot; give the host a Redfish or IPMI BMC \
                     address for power on/off"
                .into(),
        }
    }
}

fn command_line(argv: &[String], extra: &[&str]) -> String {
    argv.iter()
        .map(String::as_str)
        .chain(extra.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

fn command_failed(argv: &[String], node: &str, output: &CommandOutput) -> BmcError {
    BmcError::Command {
        command: command_line(argv, &[node]),
        status: output.status.clone(),
        stdout: output.stdout.trim().to_string(),
        stderr: output.stderr.trim().to_string(),
    }
}

fn truncate(output: &[u8]) -> String {
    text::clip_bytes(output)
}

/// Kills a command's whole process group when dropped armed (timeout, cancel, error).
struct ProcessGroup(Option<u32>);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(id) = self.0.and_then(|id| i32::try_from(id).ok()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(id),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Runs `argv… extra…` without a shell, capturing output, killed after `timeout` (when
/// there is one).
async fn run(
    argv: &[String],
    extra: &[&str],
    timeout: Option<Duration>,
) -> Result<CommandOutput, BmcError> {
    let Some((program, args)) = argv.split_first() else {
        return Err(BmcError::Config("empty command".into()));
    };
    let child = tokio::process::Command::new(program)
        .args(args)
        .args(extra)
        .env_clear()
        .envs(inherited_environment(COMMAND_ENVIRONMENT))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a timeout or a cancel stops what it started too (a
        // script's `sleep`, an `ipmitool` it runs), not just the command itself.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| BmcError::Spawn {
            program: program.clone(),
            detail: e.to_string(),
        })?;
    let mut group = ProcessGroup(child.id());
    let finished = wait_with_capped_output(child, MAX_CHILD_OUTPUT_BYTES);
    let result = match timeout {
        Some(timeout) => tokio::time::timeout(timeout, finished)
            .await
            .map_err(|_| timeout),
        None => Ok(finished.await),
    };
    if matches!(result, Ok(Ok(_))) {
        // It finished by itself; whatever it left running on purpose is its business.
        group.0 = None;
    }
    match result {
        Ok(Ok(output)) => Ok(CommandOutput {
            status: output.status.to_string(),
            success: output.status.success(),
            stdout: truncate(&output.stdout),
            stderr: truncate(&output.stderr),
        }),
        Ok(Err(e)) => Err(BmcError::Spawn {
            program: program.clone(),
            detail: e.to_string(),
        }),
        Err(after) => Err(BmcError::Timeout {
            what: format!(
                "command `{}` to finish (it was killed)",
                command_line(argv, extra)
            ),
            after,
        }),
    }
}

#[async_trait]
impl PowerDriver for CommandDriver {
    fn description(&self) -> DriverDescription {
        DriverDescription {
            kind: DriverKind::Command,
            endpoint: self.node.clone(),
            detail: format!("reboot: {}", self.config.reboot_command.join(" ")),
        }
    }

    /// `On` when the boot check says the node booted after the last reboot this driver
    /// started (or, if it started none, at all); `Transitioning` while a reboot it started
    /// has not finished; `Unknown` otherwise — the tooling cannot tell "off" from "down".
    async fn power_state(&self) -> Result<PowerState, BmcError> {
        let since = self.reboot_started();
        let booted = self
            .booted_since(since.unwrap_or(Timestamp::UNIX_EPOCH))
            .await?;
        Ok(match (booted, since) {
            (true, _) => PowerState::On,
            (false, Some(_)) => PowerState::Transitioning,
            (false, None) => PowerState::Unknown,
        })
    }

    async fn power_on(&self) -> Result<PowerOutcome, BmcError> {
        Err(self.unsupported("power on"))
    }

    async fn power_off(&self, mode: PowerOffMode) -> Result<PowerOutcome, BmcError> {
        Err(self.unsupported(&format!("{mode} power off")))
    }

    async fn reboot(&self, mode: PowerOffMode) -> Result<PowerOutcome, BmcError> {
        let output = self.run_reboot().await?;
        let combined = output.combined();
        Ok(PowerOutcome {
            request: PowerRequest::Reboot(mode),
            action: Some(format!(
                "reboot command `{}`",
                command_line(&self.config.reboot_command, &[&self.node])
            )),
            hard_fallback: None,
            output: (!combined.is_empty()).then_some(combined),
        })
    }
}
