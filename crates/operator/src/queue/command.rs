//! The Command reboot worker (CKE compatible): one task per node rebooting by command, so a
//! hanging command never stalls other entries or the controller loop. It never writes the
//! entry; every attempt of the reboot command is recorded by the loop before it runs.
//!
//! - `rebootCommand… <address>`, with `commandTimeoutSeconds`, `commandRetries`,
//!   `commandIntervalSeconds`; only when no attempt was ever recorded (after a restart the
//!   command may have run, and a second reboot is worse than a boot timeout). A failed or
//!   timed-out run is retried only after the boot check says the node has not booted since
//!   the reboot began: a command that timed out may have rebooted it already.
//! - `bootCheckCommand… <address> <unix-time-of-Rebooting>` every
//!   `bootCheckIntervalSeconds` (a failed run is retried like the reboot command) until it
//!   exits 0 and prints `true`.
//!
//! No shell; children are killed on timeout, and when the worker is cancelled.

use hostcycle_bmc::{BmcError, CommandDriver, CommandDriverConfig};
use hostcycle_core::queue::RebootConfig;
use hostcycle_core::queue::reboot::{
    AfterFailedCommand, after_failed_command, next_command_attempt,
};
use jiff::Timestamp;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Report, ReportKind};

/// One command reboot to carry out.
pub struct CommandJob {
    pub entry: String,
    pub entry_uid: String,
    pub node: String,
    /// Passed to the commands (the node's InternalIP, …).
    pub address: String,
    pub rebooting_since: Timestamp,
    pub config: RebootConfig,
    /// `Some(n)`: attempt `n` of the reboot command is recorded and must run now. `None`:
    /// the command ran (or may have run) already; only boot checks.
    pub run_attempt: Option<u32>,
}

pub async fn run(
    job: CommandJob,
    reports: mpsc::UnboundedSender<Report>,
    cancel: CancellationToken,
) {
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = work(&job, &reports) => {}
    }
}

fn send(job: &CommandJob, reports: &mpsc::UnboundedSender<Report>, kind: ReportKind) {
    let _ = reports.send(Report {
        entry: job.entry.clone(),
        entry_uid: job.entry_uid.clone(),
        kind,
    });
}

async fn work(job: &CommandJob, reports: &mpsc::UnboundedSender<Report>) {
    let driver = match CommandDriver::new(
        CommandDriverConfig {
            reboot_command: job.config.reboot_command.clone(),
            boot_check_command: job.config.boot_check_command.clone(),
            command_timeout: job.config.command_timeout,
        },
        job.address.clone(),
    ) {
        Ok(d) => d,
        Err(e) => {
            send(
                job,
                reports,
                ReportKind::RebootCommandGaveUp {
                    message: e.to_string(),
                },
            );
            return;
        }
    };

    if let Some(mut attempt) = job.run_attempt {
        loop {
            match driver.run_reboot().await {
                Ok(_) => {
                    tracing::info!(node = %job.node, attempt, "reboot command succeeded");
                    send(job, reports, ReportKind::RebootCommandSucceeded);
                    break;
                }
                Err(e) => {
                    let message = command_error(&e);
                    tracing::warn!(node = %job.node, attempt, error = %message, "reboot command failed");
                    // Did the failed run reboot the node after all? Only "not booted" runs it
                    // again.
                    let check = if attempt <= job.config.command_retries {
                        tokio::time::sleep(job.config.command_interval).await;
                        boot_check(&driver, job).await
                    } else {
                        Ok(false)
                    };
                    let next = match after_failed_command(
                        attempt,
                        job.config.command_retries,
                        check,
                    ) {
                        AfterFailedCommand::Retry { attempt } => attempt,
                        AfterFailedCommand::Booted => {
                            tracing::info!(node = %job.node, attempt, "the failed reboot command rebooted the node: the boot check printed true");
                            send(
                                job,
                                reports,
                                ReportKind::BootCheck {
                                    booted: true,
                                    detail: "the boot check printed true (after a failed run of \
                                             the reboot command)"
                                        .into(),
                                },
                            );
                            return;
                        }
                        AfterFailedCommand::GiveUp(why) => {
                            let message = format!("{message}; {why}");
                            send(job, reports, ReportKind::RebootCommandGaveUp { message });
                            break;
                        }
                    };
                    // Write-ahead: the loop records the attempt before it runs.
                    let (ack, recorded) = oneshot::channel();
                    send(
                        job,
                        reports,
                        ReportKind::RecordCommandAttempt {
                            attempt: next,
                            previous_error: message,
                            ack,
                        },
                    );
                    if recorded.await != Ok(true) {
                        return;
                    }
                    attempt = next;
                }
            }
        }
    }

    loop {
        tokio::time::sleep(job.config.boot_check_interval).await;
        let verdict = boot_check(&driver, job).await;
        let booted = matches!(verdict, Ok(true));
        send(
            job,
            reports,
            ReportKind::BootCheck {
                booted,
                detail: match verdict {
                    Ok(true) => "the boot check printed true".into(),
                    Ok(false) => "the boot check did not print true yet".into(),
                    Err(e) => e,
                },
            },
        );
        if booted {
            return;
        }
    }
}

/// One round of the boot check: a run that fails to start or times out is retried
/// `commandRetries` times, `commandIntervalSeconds` apart.
async fn boot_check(driver: &CommandDriver, job: &CommandJob) -> Result<bool, String> {
    let mut attempt = 1;
    loop {
        match driver.booted_since(job.rebooting_since).await {
            Ok(booted) => return Ok(booted),
            Err(e) => {
                let message = command_error(&e);
                match next_command_attempt(attempt, job.config.command_retries) {
                    Some(next) => {
                        tracing::debug!(node = %job.node, attempt, error = %message, "boot check failed to run; retrying");
                        tokio::time::sleep(job.config.command_interval).await;
                        attempt = next;
                    }
                    None => return Err(format!("the boot check failed: {message}")),
                }
            }
        }
    }
}

fn command_error(e: &BmcError) -> String {
    e.to_string()
}
