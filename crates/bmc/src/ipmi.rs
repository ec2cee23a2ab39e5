//! The IPMI driver: runs `ipmitool -I lanplus`. The password goes through the environment
//! (`-E`), never on the command line; ipmitool's environment is otherwise cleared (only
//! `PATH` is kept). Every run has a timeout and the child is killed when the call is dropped
//! or times out; at most 64 KiB of its output is kept.

use std::fmt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Semaphore;

use crate::address::{BmcHost, IpmiAddress};
use crate::bounded::{MAX_CHILD_OUTPUT_BYTES, wait_with_capped_output};
use crate::command::inherited_environment;
use crate::credentials::BmcCredentials;
use crate::destination::BmcNetwork;
use crate::driver::{
    BmcOperations, DriverDescription, DriverKind, PowerDriver, PowerOffMode, PowerOutcome,
    PowerReading, PowerRequest, PowerState,
};
use crate::error::BmcError;
use crate::resolve::{BmcResolver, ResolveError};
use crate::retry::{RetryPolicy, with_retries};
use crate::text;

/// IPMI v2.0 passwords are at most 20 bytes (ipmitool refuses longer ones).
const MAX_PASSWORD_BYTES: usize = 20;
/// Longest ipmitool stderr kept in an error.
const MAX_STDERR_CHARS: usize = 400;

/// ipmitool settings.
#[derive(Clone, Debug)]
pub struct IpmiOptions {
    /// The ipmitool program; looked up in `PATH` when it has no slash.
    pub ipmitool: PathBuf,
    /// RMCP+ cipher suite (`-C`). 3 (HMAC-SHA1, AES-128) is the widely supported default.
    pub cipher_suite: u8,
    /// Kill ipmitool after this long.
    pub command_timeout: Duration,
    /// ipmitool's own per-packet timeout in seconds (`-N`) and its retries (`-R`).
    pub packet_timeout_secs: u32,
    pub packet_retries: u32,
    pub retry: RetryPolicy,
}

impl Default for IpmiOptions {
    fn default() -> Self {
        IpmiOptions {
            ipmitool: PathBuf::from("ipmitool"),
            cipher_suite: 3,
            command_timeout: Duration::from_secs(30),
            packet_timeout_secs: 2,
            packet_retries: 3,
            retry: RetryPolicy::default(),
        }
    }
}

/// One host's power through ipmitool.
pub struct IpmiDriver {
    address: IpmiAddress,
    endpoint: String,
    credentials: BmcCredentials,
    options: IpmiOptions,
    permits: Arc<Semaphore>,
    /// Resolves a BMC name to the checked IP given to ipmitool (`-H`), which then does no
    /// lookup of its own.
    resolver: BmcResolver,
    /// The BMC's System GUID (`mc guid`), read once per driver: a driver is made for one
    /// address and Secret. `None` until read; `Some(None)` when the BMC reports none.
    guid: tokio::sync::OnceCell<Option<String>>,
}

impl fmt::Debug for IpmiDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpmiDriver")
            .field("endpoint", &self.endpoint)
            .field("cipher_suite", &self.options.cipher_suite)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

/// stderr lines ipmitool prints with `-v` that say nothing about a failure.
const STDERR_NOISE: &[&str] = &[
    "Loading IANA PEN Registry",
    "Running Get VSO Capabilities",
    "Invalid completion code received: Invalid command",
    "Discovered IPMB address",
];

impl IpmiDriver {
    /// Fails when the credentials cannot work over IPMI (passwords are at most 20 bytes).
    pub fn new(
        address: IpmiAddress,
        credentials: BmcCredentials,
        permits: Arc<Semaphore>,
        options: IpmiOptions,
    ) -> Result<Self, BmcError> {
        let endpoint = address.endpoint();
        // The message does not say how long the password is: that narrows a guess.
        if credentials.password().len() > MAX_PASSWORD_BYTES {
            return Err(BmcError::Config(format!(
                "the password for {endpoint} is longer than the {MAX_PASSWORD_BYTES} bytes IPMI \
                 allows; use a shorter BMC password or a Redfish address"
            )));
        }
        Ok(IpmiDriver {
            address,
            endpoint,
            credentials,
            options,
            permits,
            resolver: BmcResolver::new(&[BmcNetwork::Any]),
            guid: tokio::sync::OnceCell::new(),
        })
    }

    /// The driver resolving BMC names with `resolver` (the connector's, which knows the
    /// operator's BMC networks) instead of the system resolver as is.
    pub fn with_resolver(mut self, resolver: BmcResolver) -> Self {
        self.resolver = resolver;
        self
    }

    /// The IP ipmitool is pointed at: the address itself, or what its name resolves to,
    /// checked against the BMC networks (every address; the first is used).
    async fn target_ip(&self) -> Result<std::net::IpAddr, BmcError> {
        let name = match &self.address.host {
            BmcHost::Ip(ip) => return Ok(*ip),
            BmcHost::Name(name) => name,
        };
        let resolved = tokio::time::timeout(
            self.options.command_timeout,
            self.resolver.resolve(name, self.address.port),
        )
        .await
        .map_err(|_| BmcError::Timeout {
            what: format!("resolving the name of {}", self.endpoint),
            after: self.options.command_timeout,
        })?;
        match resolved {
            Ok(addresses) => match addresses.first() {
                Some(address) => Ok(address.ip()),
                None => Err(BmcError::Connection {
                    endpoint: self.endpoint.clone(),
                    detail: format!("{name} resolves to no address"),
                }),
            },
            Err(ResolveError::Refused(refused)) => Err(BmcError::DestinationRefused(refused)),
            Err(lookup @ ResolveError::Lookup { .. }) => Err(BmcError::Connection {
                endpoint: self.endpoint.clone(),
                detail: lookup.to_string(),
            }),
        }
    }

    /// Runs `ipmitool … <subcommand> <args>` once (`chassis power status`, `mc guid`) and
    /// returns stdout.
    async fn run_once(
        &self,
        subcommand: &str,
        args: &[&str],
        repeatable: bool,
    ) -> Result<String, BmcError> {
        // Resolved and checked before anything runs: ipmitool gets the checked IP.
        let checked_bmc_ip = self.target_ip().await?;
        let operation = format!("{subcommand} {}", args.join(" "));
        let password = self.credentials.password();
        // The password reaches ipmitool through a pipe on its stdin (`-f /dev/stdin`): not
        // its argv, and not its environment, which other processes of the operator's user
        // (reboot commands among them) could read in /proc while it runs. ipmitool cuts
        // the line it reads at a tab, CR or LF: such a password still goes through `-E`.
        let through_stdin = !password.contains(['\t', '\r', '\n']);
        let mut command = tokio::process::Command::new(&self.options.ipmitool);
        command
            .args([
                "-I",
                "lanplus",
                "-C",
                &self.options.cipher_suite.to_string(),
            ])
            .args([
                "-H",
                &checked_bmc_ip.to_string(),
                "-p",
                &self.address.port.to_string(),
            ])
            .args(["-U", self.credentials.username()])
            .args(if through_stdin {
                &["-f", "/dev/stdin"][..]
            } else {
                &["-E"][..]
            })
            .args(["-N", &self.options.packet_timeout_secs.to_string()])
            .args(["-R", &self.options.packet_retries.to_string()])
            // -v makes ipmitool say why a session failed (e.g. "RAKP 2 HMAC is invalid").
            .arg("-v")
            .arg(subcommand)
            .args(args)
            // Nothing of the operator's environment but PATH (it may hold other secrets).
            .env_clear()
            .envs(inherited_environment(&["PATH"]))
            .stdin(if through_stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if !through_stdin {
            // ipmitool reads IPMITOOL_PASSWORD first, older versions only IPMI_PASSWORD.
            command
                .env("IPMITOOL_PASSWORD", password)
                .env("IPMI_PASSWORD", password);
        }
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| BmcError::Connection {
                endpoint: self.endpoint.clone(),
                detail: "the driver was shut down".into(),
            })?;
        let mut child = command.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                BmcError::IpmitoolMissing {
                    path: self.options.ipmitool.display().to_string(),
                }
            } else {
                BmcError::Spawn {
                    program: self.options.ipmitool.display().to_string(),
                    detail: e.to_string(),
                }
            }
        })?;
        let stdin = child.stdin.take();
        let exchange = async move {
            if let Some(mut stdin) = stdin {
                use tokio::io::AsyncWriteExt;
                // One line, then end of file. A child that exited before reading it closed
                // the pipe: its exit status and stderr say why, so the write's error is not.
                if stdin.write_all(password.as_bytes()).await.is_ok() {
                    let _ = stdin.write_all(b"\n").await;
                }
                drop(stdin);
            }
            wait_with_capped_output(child, MAX_CHILD_OUTPUT_BYTES).await
        };
        // Dropping the future on timeout drops the child, which kills it (kill_on_drop).
        let output = match tokio::time::timeout(self.options.command_timeout, exchange).await {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => {
                return Err(BmcError::Spawn {
                    program: self.options.ipmitool.display().to_string(),
                    detail: e.to_string(),
                });
            }
            Err(_) => {
                let what = format!("ipmitool {operation} against {}", self.endpoint);
                let after = self.options.command_timeout;
                return Err(if repeatable {
                    BmcError::Timeout { what, after }
                } else {
                    BmcError::OutcomeUnknown { what, after }
                });
            }
        };
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() {
            return Ok(stdout);
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(self.classify_failure(&operation, output.status.to_string(), &stderr))
    }

    /// ipmitool's stderr fit for an error: it may quote the BMC, so no password and bounded
    /// (scrubbed before it is cut, so no part of the password is left).
    fn shown_stderr(&self, raw_stderr: &str) -> String {
        let scrubbed = text::scrub_secret(
            raw_stderr,
            self.credentials.username(),
            self.credentials.password(),
        );
        text::clip(&meaningful_stderr(&scrubbed))
    }

    /// Classifies on the raw text; what is kept in the error is [`Self::shown_stderr`].
    fn classify_failure(&self, operation: &str, status: String, raw_stderr: &str) -> BmcError {
        let matched = meaningful_stderr(raw_stderr);
        let stderr = self.shown_stderr(raw_stderr);
        const AUTH_FAILURES: &[&str] = &[
            "RAKP 2 HMAC is invalid",
            "unauthorized name",
            "Invalid user name",
            "RAKP 2 message indicates an error",
            "invalid password",
        ];
        const CIPHER_FAILURES: &[&str] = &[
            "is not what we requested",
            "cipher suite",
            "Invalid cipher suite",
        ];
        if AUTH_FAILURES.iter().any(|needle| matched.contains(needle)) {
            return BmcError::AuthenticationFailed {
                endpoint: self.endpoint.clone(),
                detail: format!("ipmitool: {stderr}"),
            };
        }
        if CIPHER_FAILURES
            .iter()
            .any(|needle| matched.contains(needle))
        {
            return BmcError::Unsupported {
                driver: self.description().to_string(),
                operation: format!(
                    "open a session with cipher suite {}",
                    self.options.cipher_suite
                ),
                reason: format!("ipmitool: {stderr}; choose a cipher suite the BMC offers"),
            };
        }
        // A BMC that refuses a command answered, so repeating will not help.
        let rejected = matched.contains("Unable to set Chassis Power Control");
        BmcError::Ipmitool {
            endpoint: self.endpoint.clone(),
            operation: operation.to_string(),
            status,
            stderr,
            transient: !rejected,
        }
    }

    async fn run(&self, args: &[&str], repeatable: bool) -> Result<String, BmcError> {
        self.run_subcommand("chassis", args, repeatable).await
    }

    async fn run_subcommand(
        &self,
        subcommand: &str,
        args: &[&str],
        repeatable: bool,
    ) -> Result<String, BmcError> {
        let operation = format!(
            "ipmitool {subcommand} {} against {}",
            args.join(" "),
            self.endpoint
        );
        with_retries(&self.options.retry, &operation, || {
            self.run_once(subcommand, args, repeatable)
        })
        .await
    }

    /// The BMC's System GUID as an identity (`guid:<GUID>`), read once: `None` when the BMC
    /// reports none or refuses the command (remembered). A read lost to a timeout or a broken
    /// connection is not remembered: the next reading tries again.
    async fn identity(&self) -> Option<String> {
        self.guid
            .get_or_try_init(|| async {
                match self.run_subcommand("mc", &["guid"], true).await {
                    Ok(stdout) => Ok(parse_system_guid(&stdout)),
                    Err(e) if matches!(e.reason(), "Timeout" | "ConnectionFailed") => Err(e),
                    Err(_) => Ok(None),
                }
            })
            .await
            .ok()
            .cloned()
            .flatten()
    }

    async fn chassis_power(&self, verb: &str, repeatable: bool) -> Result<(), BmcError> {
        self.run(&["power", verb], repeatable).await.map(drop)
    }
}

/// The GUID in `ipmitool mc guid`'s output (`System GUID  : 4c4c4544-…`), as an identity.
pub fn parse_system_guid(stdout: &str) -> Option<String> {
    stdout.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "System GUID")
            .then(|| crate::driver::identity_of("guid", Some(value.trim())))
            .flatten()
    })
}

fn meaningful_stderr(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(|l| l.trim_start_matches('>').trim())
        .filter(|l| !l.is_empty() && !STDERR_NOISE.iter().any(|noise| l.starts_with(noise)))
        .collect();
    let mut text = lines.join("; ");
    if text.is_empty() {
        text = "(no error output)".into();
    }
    if text.chars().count() > MAX_STDERR_CHARS {
        text = text.chars().take(MAX_STDERR_CHARS).collect::<String>() + "…";
    }
    text
}

/// `Chassis Power is on|off` → the state.
pub fn parse_chassis_power(stdout: &str) -> Option<PowerState> {
    stdout.lines().find_map(|line| match line.trim() {
        "Chassis Power is on" => Some(PowerState::On),
        "Chassis Power is off" => Some(PowerState::Off),
        _ => None,
    })
}

/// The power calls; [`BmcOperations`] makes them a [`PowerDriver`] bounded by the call
/// deadline.
#[async_trait]
impl BmcOperations for IpmiDriver {
    fn describe(&self) -> DriverDescription {
        DriverDescription {
            kind: DriverKind::Ipmi,
            endpoint: self.endpoint.clone(),
            detail: format!("lanplus, cipher suite {}", self.options.cipher_suite),
        }
    }

    fn call_deadline(&self) -> Duration {
        self.options.retry.deadline
    }

    fn credentials(&self) -> Option<&BmcCredentials> {
        Some(&self.credentials)
    }

    async fn read_power_reading(&self) -> Result<PowerReading, BmcError> {
        let state = self.read_power_state().await?;
        Ok(PowerReading {
            state,
            identity: self.identity().await,
        })
    }

    async fn read_power_state(&self) -> Result<PowerState, BmcError> {
        let stdout = self.run(&["power", "status"], true).await?;
        parse_chassis_power(&stdout).ok_or_else(|| BmcError::IpmitoolOutput {
            endpoint: self.endpoint.clone(),
            operation: "chassis power status".into(),
            output: text::from_bmc(
                stdout.trim(),
                self.credentials.username(),
                self.credentials.password(),
            ),
        })
    }

    async fn request_power_on(&self) -> Result<PowerOutcome, BmcError> {
        let request = PowerRequest::On;
        if self.read_power_state().await? == PowerState::On {
            return Ok(PowerOutcome::already_done(request));
        }
        self.chassis_power("on", true).await?;
        Ok(PowerOutcome::sent(request, "chassis power on"))
    }

    async fn request_power_off(&self, mode: PowerOffMode) -> Result<PowerOutcome, BmcError> {
        let request = PowerRequest::Off(mode);
        if self.read_power_state().await? == PowerState::Off {
            return Ok(PowerOutcome::already_done(request));
        }
        let mut hard_fallback = None;
        if mode == PowerOffMode::Soft {
            match self.chassis_power("soft", true).await {
                Ok(()) => return Ok(PowerOutcome::sent(request, "chassis power soft")),
                Err(BmcError::Ipmitool {
                    transient: false,
                    stderr,
                    ..
                }) => {
                    let reason = format!("the BMC rejected chassis power soft: {stderr}");
                    tracing::info!(endpoint = %self.endpoint, %reason, "soft request carried out hard");
                    hard_fallback = Some(reason);
                }
                Err(e) => return Err(e),
            }
        }
        self.chassis_power("off", true).await?;
        Ok(PowerOutcome {
            request,
            action: Some("chassis power off".into()),
            hard_fallback,
            output: None,
        })
    }

    async fn request_reboot(&self, mode: PowerOffMode) -> Result<PowerOutcome, BmcError> {
        let request = PowerRequest::Reboot(mode);
        if self.read_power_state().await? == PowerState::Off {
            self.chassis_power("on", true).await?;
            return Ok(PowerOutcome::sent(
                request,
                "chassis power on (host was off)",
            ));
        }
        self.chassis_power("reset", false).await?;
        Ok(PowerOutcome {
            request,
            action: Some("chassis power reset".into()),
            hard_fallback: (mode == PowerOffMode::Soft)
                .then(|| "IPMI has no graceful restart".to_string()),
            output: None,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_the_system_guid() {
        let out =
            "System GUID  : 4c4c4544-0042-3510-8057-b7c04f423432\nTimestamp    : 01/01/1970\n";
        assert_eq!(
            parse_system_guid(out).as_deref(),
            Some("guid:4c4c4544-0042-3510-8057-b7c04f423432")
        );
        assert_eq!(parse_system_guid("System GUID  : <script>\n"), None);
        assert_eq!(parse_system_guid(""), None);
    }

    #[test]
    fn parses_chassis_power_output() {
        assert_eq!(
            parse_chassis_power("Chassis Power is on\n"),
            Some(PowerState::On)
        );
        assert_eq!(
            parse_chassis_power("Chassis Power is off"),
            Some(PowerState::Off)
        );
        assert_eq!(parse_chassis_power("Chassis Power Control: Up/On"), None);
        assert_eq!(parse_chassis_power(""), None);
    }

    #[test]
    fn stderr_noise_is_dropped() {
        let stderr = "Loading IANA PEN Registry...\n> RAKP 2 HMAC is invalid\n\
                      Error: Unable to establish IPMI v2 / RMCP+ session\n";
        assert_eq!(
            meaningful_stderr(stderr),
            "RAKP 2 HMAC is invalid; Error: Unable to establish IPMI v2 / RMCP+ session"
        );
        assert_eq!(meaningful_stderr(""), "(no error output)");
    }
}
