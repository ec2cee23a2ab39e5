//! A fake IPMI BMC (pyghmi) for one host, on a loopback UDP port.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{DEFAULT_START_TIMEOUT, FakePower, other};
use crate::TestkitError;
use crate::process::{ManagedProcess, free_udp_port, require_program, venv_bin};

const SCRIPT: &str = include_str!("fake_ipmi_bmc.py");

/// A running fake IPMI BMC. Dropping it stops the process (by PID) and removes its files.
pub struct FakeIpmiBmc {
    process: ManagedProcess,
    dir: tempfile::TempDir,
    port: u16,
    state_file: PathBuf,
}

impl std::fmt::Debug for FakeIpmiBmc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeIpmiBmc")
            .field("address", &self.address())
            .field("pid", &self.process.pid())
            .finish_non_exhaustive()
    }
}

impl FakeIpmiBmc {
    /// Starts a BMC accepting `user`/`password` whose host is `initial_power`, and waits
    /// until it listens.
    pub async fn start(
        user: &str,
        password: &str,
        initial_power: FakePower,
    ) -> Result<FakeIpmiBmc, TestkitError> {
        let python = venv_bin("python");
        require_program("python with pyghmi (fake IPMI BMC)", &python)?;
        let dir = tempfile::Builder::new()
            .prefix("fake-ipmi-")
            .tempdir()
            .map_err(|source| TestkitError::Io {
                what: "creating a temp dir".into(),
                source,
            })?;
        let script = dir.path().join("fake_ipmi_bmc.py");
        std::fs::write(&script, SCRIPT).map_err(|source| TestkitError::Io {
            what: format!("writing {}", script.display()),
            source,
        })?;
        let state_file = dir.path().join("power");
        let port = free_udp_port()?;
        let mut command = Command::new(&python);
        command
            .arg("-u")
            .arg(&script)
            .args(["--address", "127.0.0.1", "--port", &port.to_string()])
            .args(["--user", user, "--power", initial_power.ipmi()])
            .arg("--state-file")
            .arg(&state_file)
            // The password stays out of the command line (and `ps`).
            .env("FAKE_BMC_PASSWORD", password);
        let mut process = ManagedProcess::spawn("fake-ipmi-bmc", command, dir.path())?;
        wait_listening(&mut process, DEFAULT_START_TIMEOUT).await?;
        Ok(FakeIpmiBmc {
            process,
            dir,
            port,
            state_file,
        })
    }

    /// `ipmi://127.0.0.1:PORT`
    pub fn address(&self) -> String {
        format!("ipmi://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The host's power state as the fake BMC holds it (read from its state file, not IPMI).
    pub fn power_state(&self) -> Result<FakePower, TestkitError> {
        let what = format!("reading {}", self.state_file.display());
        let text =
            std::fs::read_to_string(&self.state_file).map_err(|source| TestkitError::Io {
                what: what.clone(),
                source,
            })?;
        FakePower::parse(&text).ok_or_else(|| other(what, format!("unexpected state {text:?}")))
    }

    /// Errors naming the BMC and its log if it has exited.
    pub fn ensure_running(&mut self) -> Result<(), TestkitError> {
        self.process.ensure_running()
    }
}

/// Waits for the script's "listening" line (printed after the UDP socket is bound).
async fn wait_listening(
    process: &mut ManagedProcess,
    timeout: Duration,
) -> Result<(), TestkitError> {
    let start = Instant::now();
    loop {
        process.ensure_running()?;
        let log = std::fs::read_to_string(process.log_path()).unwrap_or_default();
        if log.lines().any(|l| l.starts_with("listening on")) {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(TestkitError::Timeout {
                what: format!(
                    "the fake IPMI BMC to listen (log: {})",
                    process.log_path().display()
                ),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
