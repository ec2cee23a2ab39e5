//! The Command reboot worker (CKE compatible): one task per node rebooting by command, so a
//! hanging command never stalls other entries or the controller loop. It never writes the
//! entry; every attempt of the reboot command is recorded by the loop before it runs.
//!
//! - `rebootCommand… <address>`, with `commandTimeoutSeconds` (0: none), `commandRetries`,
//!   `commandIntervalSeconds`; only when no attempt was ever recorded (after a restart the
//!   command may have run, and a second reboot is worse than a boot timeout). A failed or
//!   timed-out run is retried only after the boot check says the node has not booted since
//!   the reboot began: a command that timed out may have rebooted it already.
//! - `bootCheckCommand… <address> <unix-time-of-Rebooting>` every
//!   `bootCheckIntervalSeconds` (a failed run is retried like the reboot command) until it
//!   exits 0 and prints `true`.
//!
//! No shell; children are killed on timeout, and when the worker is cancelled. The address
//! comes from the Node's status (its kubelet writes it): a job is only made for an IP
//! address or a DNS name ([`CommandJob::checked`]), never for a value a command would read
//! as an option (`-oProxyCommand=…`), nor for an address another Node reports too (the
//! commands could reach that node).

use hostcycle_api::reasons::queue_event_reason;
use hostcycle_bmc::{BmcError, CommandDriver, CommandDriverConfig};
use hostcycle_core::queue::address::{ambiguous_address_refusal, unsafe_address_refusal};
use hostcycle_core::queue::reboot::{
    AfterFailedCommand, COMMAND_RETRY_SETTLE, FailedRun, after_failed_command, next_command_attempt,
};
use hostcycle_core::queue::{QueueNodeView, RebootConfig};
use jiff::Timestamp;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Report, ReportKind};

/// One command reboot to carry out.
#[derive(Debug)]
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

/// Why a node's commands are not run: the reason of the Warning Event and the entry's
/// message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: String,
}

/// A job whose address may be passed to the commands: the only kind [`run`] takes.
#[derive(Debug)]
pub struct CheckedJob(CommandJob);

impl CheckedJob {
    pub fn job(&self) -> &CommandJob {
        &self.0
    }
}

impl CommandJob {
    /// The job, if its address is an IP address or a DNS name that none of the other `nodes`
    /// reports; else why its commands must not run (an address starting with `-` would be
    /// read as an option by ssh-like tools; another node's address would reach that node).
    pub fn checked<'a>(
        self,
        nodes: impl IntoIterator<Item = &'a QueueNodeView>,
    ) -> Result<CheckedJob, Refusal> {
        if let Some(message) = unsafe_address_refusal(&self.node, &self.address) {
            return Err(Refusal {
                reason: queue_event_reason::UNSAFE_NODE_ADDRESS,
                message,
            });
        }
        match ambiguous_address_refusal(&self.node, &self.address, nodes) {
            None => Ok(CheckedJob(self)),
            Some(message) => Err(Refusal {
                reason: queue_event_reason::AMBIGUOUS_NODE_ADDRESS,
                message,
            }),
        }
    }
}

pub async fn run(
    job: CheckedJob,
    reports: mpsc::UnboundedSender<Report>,
    cancel: CancellationToken,
) {
    let job = job.0;
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
    // The commands come from the operator's command sets, never from the RebootQueue.
    let set = match &job.config.commands {
        Ok(set) => set,
        Err(why) => {
            send(
                job,
                reports,
                ReportKind::RebootCommandGaveUp {
                    message: why.clone(),
                },
            );
            return;
        }
    };
    let driver = match CommandDriver::new(
        CommandDriverConfig {
            reboot_command: set.reboot.clone(),
            boot_check_command: set.boot_check.clone(),
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
                    let run = if matches!(e, hostcycle_bmc::BmcError::Timeout { .. }) {
                        FailedRun::TimedOut
                    } else {
                        FailedRun::Exited
                    };
                    tracing::warn!(node = %job.node, attempt, error = %message, ?run, "reboot command failed");
                    // Did the failed run reboot the node after all? Only a run that exited, and
                    // a boot check that reaches the node a while later and says "not booted",
                    // runs it again.
                    let check = if attempt <= job.config.command_retries {
                        let wait = match run {
                            FailedRun::Exited => {
                                job.config.command_interval.max(COMMAND_RETRY_SETTLE)
                            }
                            FailedRun::TimedOut => job.config.command_interval,
                        };
                        tokio::time::sleep(wait).await;
                        boot_check(&driver, job).await
                    } else {
                        Ok(false)
                    };
                    let next = match after_failed_command(
                        attempt,
                        job.config.command_retries,
                        run,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    use super::*;

    fn job(address: &str, reboot_command: Vec<String>) -> CommandJob {
        CommandJob {
            entry: "entry-1".into(),
            entry_uid: "uid-1".into(),
            node: "worker-3".into(),
            address: address.into(),
            rebooting_since: Timestamp::UNIX_EPOCH,
            config: RebootConfig {
                commands: Ok(hostcycle_core::queue::commands::CommandSet {
                    reboot: reboot_command.clone(),
                    boot_check: reboot_command,
                }),
                command_timeout: Some(Duration::from_secs(10)),
                boot_check_interval: Duration::from_millis(10),
                ..hostcycle_core::queue::QueueConfig::default().reboot
            },
            run_attempt: Some(1),
        }
    }

    /// A node whose address starts with `-` gets no job: the commands never see it, and the
    /// refusal says which node and why, as an `UnsafeNodeAddress` Warning.
    #[test]
    fn an_option_like_address_gets_no_job() {
        for address in ["-oProxyCommand=x", "-", "a b", "$(x)", "a;b", "`x`", ""] {
            let refusal = job(address, vec!["/bin/true".into()])
                .checked([])
                .unwrap_err();
            assert_eq!(refusal.reason, "UnsafeNodeAddress", "{address:?}");
            assert!(
                refusal
                    .message
                    .starts_with("node worker-3 cannot be rebooted by command"),
                "{}",
                refusal.message
            );
        }
        let refusal = job("-oProxyCommand=x", vec![]).checked([]).unwrap_err();
        assert!(
            refusal.message.contains("starts with '-'"),
            "{}",
            refusal.message
        );
        for address in ["10.0.0.3", "fd00::3", "worker-3.example"] {
            let checked = job(address, vec![]).checked([]).unwrap();
            assert_eq!(checked.job().address, address);
        }
    }

    /// A node reporting another node's address gets no job: the commands would reach the
    /// other node. The refusal names both nodes and the address, as an
    /// `AmbiguousNodeAddress` Warning; its own entry in the list is not "another node".
    #[test]
    fn another_nodes_address_gets_no_job() {
        let view = |name: &str, addresses: &[&str]| QueueNodeView {
            name: name.into(),
            api_server: false,
            ready: true,
            ready_heartbeat: None,
            boot_id: None,
            unschedulable: false,
            cordoned_by_queue: false,
            volumes_in_use: 0,
            address: addresses.first().map_or(name, |a| a).to_string(),
            reported_addresses: addresses.iter().map(|a| a.to_string()).collect(),
        };
        let nodes = [
            view("worker-3", &["10.0.0.3"]),
            view("worker-4", &["10.0.0.4", "fd00::3"]),
        ];
        let refusal = job("::ffff:10.0.0.4", vec![]).checked(&nodes).unwrap_err();
        assert_eq!(refusal.reason, "AmbiguousNodeAddress");
        for words in ["node worker-3", "node worker-4", "\"::ffff:10.0.0.4\""] {
            assert!(refusal.message.contains(words), "{}", refusal.message);
        }
        let refusal = job("fd00:0::3", vec![]).checked(&nodes).unwrap_err();
        assert_eq!(refusal.reason, "AmbiguousNodeAddress");
        let checked = job("10.0.0.3", vec![]).checked(&nodes).unwrap();
        assert_eq!(checked.job().address, "10.0.0.3");
        // An unsafe address is refused as such, whatever else reports it.
        let refusal = job("-x", vec![]).checked(&nodes).unwrap_err();
        assert_eq!(refusal.reason, "UnsafeNodeAddress");
    }

    /// A checked job runs the reboot command with the address as its last argument.
    #[tokio::test]
    async fn a_checked_job_passes_its_address_to_the_command() {
        let dir =
            std::env::temp_dir().join(format!("hostcycle-command-argv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("argv");
        let script = dir.join("record.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nprintf '%s|' \"$@\" >> {}\necho true\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let checked = job("10.0.0.3", vec![script.display().to_string()])
            .checked([])
            .unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let worker = tokio::spawn(run(checked, tx, cancel.clone()));
        let mut kinds = Vec::new();
        while let Some(report) = rx.recv().await {
            let done = matches!(report.kind, ReportKind::BootCheck { booted: true, .. });
            kinds.push(format!("{:?}", report.kind));
            if done {
                break;
            }
        }
        cancel.cancel();
        worker.await.unwrap();
        assert!(kinds[0].contains("RebootCommandSucceeded"), "{kinds:?}");
        let argv = std::fs::read_to_string(&log).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(argv.starts_with("10.0.0.3|"), "{argv}");
    }
}
