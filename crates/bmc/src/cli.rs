//! `hostcycle bmc status|on|off|cycle`: the power layer for people debugging a BMC.
//!
//! The password comes from `--password-file` or `HOSTCYCLE_BMC_PASSWORD`, never from a flag
//! value (flags end up in shell history and `ps`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::credentials::{BmcCredentials, password_from_file};
use crate::driver::{PowerDriver, PowerOffMode, PowerOutcome, PowerState};
use crate::redfish::RedfishAuthMode;
use crate::soft_off::{OffPath, SoftOffPolicy, power_off_with_fallback, wait_for_power_state};
use crate::{BmcConnector, ConnectorOptions, HostConnectOptions, IpmiOptions, RetryPolicy};

/// The environment variable the password can come from.
pub const PASSWORD_ENV: &str = "HOSTCYCLE_BMC_PASSWORD";

/// `hostcycle bmc …`
#[derive(Debug, Clone, clap::Args)]
pub struct BmcArgs {
    #[command(subcommand)]
    pub command: BmcCommand,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum BmcCommand {
    /// Print the host's power state.
    Status(StatusArgs),
    /// Power the host on and wait until it is on.
    On(OnArgs),
    /// Power the host off and wait until it is off: soft first, hard after --soft-timeout.
    Off(OffArgs),
    /// Power off (as `off`), wait until off, power on, wait until on.
    Cycle(CycleArgs),
    /// Ask the BMC to restart the host (Redfish ForceRestart or GracefulRestart, IPMI power
    /// reset or soft) and return once it accepted: what a reboot command such as
    /// `ipmitool chassis power cycle` does, so a reboot queue's commandTimeoutSeconds never
    /// races a power cycle's own duration.
    Restart(RestartArgs),
}

/// How to reach the BMC.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectionArgs {
    /// BMC address: redfish://host[:port]/redfish/v1/Systems/<id>, redfish+http://…,
    /// idrac-redfish://…, ipmi://host[:port] or host[:port].
    #[arg(long, env = "HOSTCYCLE_BMC_ADDRESS")]
    pub address: String,
    /// BMC user name.
    #[arg(long, env = "HOSTCYCLE_BMC_USERNAME")]
    pub username: String,
    /// File holding the BMC password (surrounding whitespace is trimmed). Without it the
    /// password is read from HOSTCYCLE_BMC_PASSWORD.
    #[arg(long)]
    pub password_file: Option<PathBuf>,
    /// Do not verify the BMC's TLS certificate.
    #[arg(long)]
    pub insecure: bool,
    /// Verify the BMC's certificate against the CAs in this PEM file instead of the system store.
    #[arg(long, conflicts_with = "insecure")]
    pub ca_file: Option<PathBuf>,
    /// Redfish authentication.
    #[arg(long, value_enum, default_value_t = RedfishAuthMode::Auto)]
    pub auth: RedfishAuthMode,
    /// IPMI cipher suite.
    #[arg(long, default_value_t = 3)]
    pub ipmi_cipher_suite: u8,
    /// Timeout of one request to the BMC (e.g. 30s, 1m).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub request_timeout: Duration,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// How long to wait for a power state, and how often to look.
#[derive(Debug, Clone, clap::Args)]
pub struct WaitArgs {
    /// Give up waiting for the power state after this long.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    pub wait_timeout: Duration,
    /// How often to read the power state while waiting.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub poll_interval: Duration,
}

#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct OnArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    #[command(flatten)]
    pub wait: WaitArgs,
    /// Return once the request is accepted, without waiting for the host to be on.
    #[arg(long)]
    pub no_wait: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct OffArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    #[command(flatten)]
    pub wait: WaitArgs,
    /// Cut power at once instead of asking the OS to shut down.
    #[arg(long)]
    pub hard: bool,
    /// How long a soft power-off may take before power is cut.
    #[arg(long, value_parser = parse_duration, default_value = "180s")]
    pub soft_timeout: Duration,
}

#[derive(Debug, Clone, clap::Args)]
pub struct CycleArgs {
    #[command(flatten)]
    pub off: OffArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RestartArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Cut power at once (ForceRestart) instead of asking the OS to restart.
    #[arg(long)]
    pub hard: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

/// `30`, `30s`, `2m`, `1m 30s` or ISO 8601 (`PT30S`); at most 365 days: the one command-line
/// grammar (`hostcycle_duration`).
pub use hostcycle_duration::parse_duration;

/// What a command did; printed as text or JSON.
#[derive(Debug, Clone, Serialize)]
pub struct CliReport {
    pub command: &'static str,
    pub address: String,
    pub driver: String,
    /// The power state at the end.
    pub power_state: PowerState,
    /// Requests sent, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<PowerOutcome>,
    /// How the host went off (off and cycle).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub off_path: Option<OffPath>,
    pub elapsed_seconds: f64,
}

impl CliReport {
    pub fn render(&self, format: OutputFormat) -> anyhow::Result<String> {
        Ok(match format {
            OutputFormat::Json => serde_json::to_string_pretty(self)?,
            OutputFormat::Text => {
                let mut lines = vec![
                    format!("power: {}", self.power_state),
                    format!("bmc: {}", self.driver),
                ];
                lines.extend(self.actions.iter().map(|a| format!("did: {a}")));
                if let Some(path) = self.off_path {
                    lines.push(format!("off path: {}", off_path_text(path)));
                }
                lines.push(format!("took: {:.1}s", self.elapsed_seconds));
                lines.join("\n")
            }
        })
    }
}

fn off_path_text(path: OffPath) -> &'static str {
    match path {
        OffPath::AlreadyOff => "already off",
        OffPath::Soft => "soft (clean shutdown)",
        OffPath::Hard => "hard (requested)",
        OffPath::SoftUnavailable => "hard (soft not offered or rejected by the BMC)",
        OffPath::SoftTimedOut => "hard (still on after the soft timeout)",
        OffPath::Escalated => "hard (escalated)",
    }
}

/// Runs a `hostcycle bmc` command and prints its report to stdout.
pub async fn run(args: BmcArgs) -> anyhow::Result<()> {
    let format = args.command.connection().output;
    let report = execute(&args).await?;
    println!("{}", report.render(format)?);
    Ok(())
}

impl BmcCommand {
    pub fn connection(&self) -> &ConnectionArgs {
        match self {
            BmcCommand::Status(a) => &a.connection,
            BmcCommand::On(a) => &a.connection,
            BmcCommand::Off(a) => &a.connection,
            BmcCommand::Cycle(a) => &a.off.connection,
            BmcCommand::Restart(a) => &a.connection,
        }
    }
}

fn read_password(args: &ConnectionArgs) -> anyhow::Result<String> {
    if let Some(path) = &args.password_file {
        return Ok(password_from_file(path)?);
    }
    match std::env::var(PASSWORD_ENV) {
        Ok(password) => Ok(password.trim().to_string()),
        Err(_) => bail!("no BMC password: give --password-file FILE or set {PASSWORD_ENV}"),
    }
}

fn connect(args: &ConnectionArgs) -> anyhow::Result<std::sync::Arc<dyn PowerDriver>> {
    let credentials = BmcCredentials::new(&args.username, read_password(args)?)?;
    let ca_bundle_pem = match &args.ca_file {
        Some(path) => Some(
            std::fs::read(path)
                .with_context(|| format!("reading the CA file {}", path.display()))?,
        ),
        None => None,
    };
    let host = HostConnectOptions {
        disable_certificate_verification: args.insecure,
        ca_bundle_pem,
        redfish_auth: args.auth,
    };
    let options = ConnectorOptions {
        request_timeout: args.request_timeout,
        retry: RetryPolicy {
            deadline: crate::deadline::scaled(args.request_timeout, 3),
            ..RetryPolicy::default()
        },
        ipmi: IpmiOptions {
            cipher_suite: args.ipmi_cipher_suite,
            ..IpmiOptions::default()
        },
        ..ConnectorOptions::default()
    };
    Ok(BmcConnector::new(options).connect_str(&args.address, credentials, &host)?)
}

/// Runs a command and returns its report (what [`run`] prints). Logs out of the BMC before
/// returning, whatever happened: a session left open holds one of the BMC's few slots until
/// the BMC times it out.
pub async fn execute(args: &BmcArgs) -> anyhow::Result<CliReport> {
    let connection = args.command.connection();
    let driver = connect(connection)?;
    let result = execute_with(args, driver.as_ref()).await;
    close(driver.as_ref(), connection.request_timeout).await;
    result
}

/// Logs out, waiting at most `deadline`; a failure is a warning (the command's result stands).
async fn close(driver: &dyn PowerDriver, deadline: Duration) {
    match tokio::time::timeout(deadline, driver.close()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(
            error = %e,
            "could not log out of the BMC; its session stays open until the BMC times it out"
        ),
        Err(_) => tracing::warn!(
            after = ?deadline,
            "logging out of the BMC timed out; its session stays open until the BMC times it out"
        ),
    }
}

async fn execute_with(args: &BmcArgs, driver: &dyn PowerDriver) -> anyhow::Result<CliReport> {
    let start = tokio::time::Instant::now();
    let connection = args.command.connection();
    let mut report = CliReport {
        command: "",
        address: connection.address.clone(),
        driver: driver.description().to_string(),
        power_state: PowerState::Unknown,
        actions: Vec::new(),
        off_path: None,
        elapsed_seconds: 0.0,
    };
    match &args.command {
        BmcCommand::Status(_) => {
            report.command = "status";
            report.power_state = driver.power_state().await?;
        }
        BmcCommand::On(on) => {
            report.command = "on";
            report.actions.push(driver.power_on().await?);
            report.power_state = if on.no_wait {
                driver.power_state().await?
            } else {
                wait_on(driver, &on.wait).await?
            };
        }
        BmcCommand::Off(off) => {
            report.command = "off";
            power_off(driver, off, &mut report).await?;
        }
        BmcCommand::Cycle(cycle) => {
            report.command = "cycle";
            power_off(driver, &cycle.off, &mut report).await?;
            report.actions.push(driver.power_on().await?);
            report.power_state = wait_on(driver, &cycle.off.wait).await?;
        }
        BmcCommand::Restart(restart) => {
            report.command = "restart";
            let mode = if restart.hard {
                PowerOffMode::Hard
            } else {
                PowerOffMode::Soft
            };
            report.actions.push(driver.reboot(mode).await?);
            report.power_state = driver.power_state().await?;
        }
    }
    report.elapsed_seconds = (start.elapsed().as_secs_f64() * 10.0).round() / 10.0;
    Ok(report)
}

async fn wait_on(driver: &dyn PowerDriver, wait: &WaitArgs) -> anyhow::Result<PowerState> {
    Ok(wait_for_power_state(
        driver,
        PowerState::On,
        wait.wait_timeout,
        wait.poll_interval,
    )
    .await?)
}

async fn power_off(
    driver: &dyn PowerDriver,
    off: &OffArgs,
    report: &mut CliReport,
) -> anyhow::Result<()> {
    let mode = if off.hard {
        PowerOffMode::Hard
    } else {
        PowerOffMode::Soft
    };
    let policy = SoftOffPolicy {
        soft_timeout: off.soft_timeout,
        poll_interval: off.wait.poll_interval,
        hard_timeout: off.wait.wait_timeout,
    };
    let off_report = power_off_with_fallback(driver, mode, &policy, None).await?;
    report.actions.extend(off_report.outcomes);
    report.off_path = Some(off_report.path);
    report.power_state = PowerState::Off;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct TestCli {
        #[command(subcommand)]
        command: BmcCommand,
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-5s").is_err());
    }

    #[test]
    fn huge_durations_are_refused_not_a_panic() {
        for text in [
            "18446744073709551615",
            "18446744073709551615s",
            "9223372036854775807s",
            "8785h",
            "PT876000H",
        ] {
            let err = parse_duration(text).unwrap_err().to_string();
            assert!(
                err.contains("longer than the maximum of 365 days") || err.contains("too big"),
                "{text}: {err}"
            );
        }
        assert_eq!(
            parse_duration("8760h").unwrap(),
            crate::deadline::MAX_DURATION
        );
    }

    #[test]
    fn parses_the_documented_command_lines() {
        let cli = TestCli::try_parse_from([
            "bmc",
            "off",
            "--hard",
            "--address",
            "redfish://h/redfish/v1/Systems/1",
            "--username",
            "admin",
            "--password-file",
            "/tmp/pw",
            "--insecure",
            "-o",
            "json",
        ])
        .unwrap();
        let BmcCommand::Off(off) = cli.command else {
            panic!("expected off")
        };
        assert!(off.hard && off.connection.insecure);
        assert_eq!(off.connection.output, OutputFormat::Json);
        assert_eq!(off.soft_timeout, Duration::from_secs(180));

        let cli = TestCli::try_parse_from([
            "bmc",
            "cycle",
            "--address",
            "ipmi://h",
            "--username",
            "u",
            "--soft-timeout",
            "20s",
        ])
        .unwrap();
        let BmcCommand::Cycle(cycle) = cli.command else {
            panic!("expected cycle")
        };
        assert_eq!(cycle.off.soft_timeout, Duration::from_secs(20));
        assert!(!cycle.off.hard);
    }

    #[test]
    fn there_is_no_password_flag() {
        let err = TestCli::try_parse_from([
            "bmc",
            "status",
            "--address",
            "h",
            "--username",
            "u",
            "--password",
            "x",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("--password"), "{err}");
    }

    #[test]
    fn insecure_and_ca_file_conflict() {
        assert!(
            TestCli::try_parse_from([
                "bmc",
                "status",
                "--address",
                "h",
                "--username",
                "u",
                "--insecure",
                "--ca-file",
                "x",
            ])
            .is_err()
        );
    }

    #[test]
    fn text_and_json_rendering() {
        let report = CliReport {
            command: "off",
            address: "redfish://h/redfish/v1/Systems/1".into(),
            driver: "redfish https://h:443 (system /redfish/v1/Systems/1)".into(),
            power_state: PowerState::Off,
            actions: vec![PowerOutcome::sent(
                crate::PowerRequest::Off(PowerOffMode::Soft),
                "ResetType=GracefulShutdown",
            )],
            off_path: Some(OffPath::Soft),
            elapsed_seconds: 3.2,
        };
        let text = report.render(OutputFormat::Text).unwrap();
        assert!(text.starts_with("power: off\n"), "{text}");
        assert!(
            text.contains("did: soft power off: sent ResetType=GracefulShutdown"),
            "{text}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&report.render(OutputFormat::Json).unwrap()).unwrap();
        assert_eq!(json["power_state"], "off");
        assert_eq!(json["off_path"], "soft");
        assert_eq!(json["actions"][0]["request"]["operation"], "off");
        assert_eq!(json["actions"][0]["request"]["mode"], "soft");
    }
}
