//! Child processes for tests and the lab: each one logs to a file and is stopped by its PID
//! when its handle drops — also when a test panics.

use std::fs::File;
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::TestkitError;

/// How long a component gets to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A spawned component whose stdout and stderr go to `<log_dir>/<name>.log`.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Option<Child>,
    pid: u32,
    log_path: PathBuf,
}

impl ManagedProcess {
    /// Starts `cmd`, sending its output to `<log_dir>/<name>.log`.
    pub fn spawn(
        name: &str,
        mut cmd: Command,
        log_dir: &Path,
    ) -> Result<ManagedProcess, TestkitError> {
        std::fs::create_dir_all(log_dir).map_err(|source| TestkitError::Io {
            what: format!("creating log directory {}", log_dir.display()),
            source,
        })?;
        let log_path = log_dir.join(format!("{name}.log"));
        let log = File::create(&log_path).map_err(|source| TestkitError::Io {
            what: format!("creating log file {}", log_path.display()),
            source,
        })?;
        let log_err = log.try_clone().map_err(|source| TestkitError::Io {
            what: format!("opening log file {}", log_path.display()),
            source,
        })?;
        cmd.stdin(Stdio::null()).stdout(log).stderr(log_err);
        let program = cmd.get_program().to_string_lossy().into_owned();
        let child = cmd.spawn().map_err(|source| TestkitError::Spawn {
            component: name.to_string(),
            program,
            source,
        })?;
        let pid = child.id();
        tracing::debug!(component = name, pid, log = %log_path.display(), "started");
        Ok(ManagedProcess {
            name: name.to_string(),
            child: Some(child),
            pid,
            log_path,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Errors naming the component, its exit status and its log if it has exited.
    pub fn ensure_running(&mut self) -> Result<(), TestkitError> {
        let Some(child) = self.child.as_mut() else {
            return Err(self.exited_error(None));
        };
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.exited_error(Some(status))),
            Err(source) => Err(TestkitError::Io {
                what: format!(
                    "checking whether {} (pid {}) is running",
                    self.name, self.pid
                ),
                source,
            }),
        }
    }

    fn exited_error(&self, status: Option<ExitStatus>) -> TestkitError {
        TestkitError::ComponentExited {
            component: self.name.clone(),
            status: status
                .map(|s| s.to_string())
                .unwrap_or_else(|| "stopped".into()),
            log: self.log_path.clone(),
            log_tail: log_tail(&self.log_path, 15),
        }
    }

    /// Sends SIGTERM, waits up to a grace period, then SIGKILLs. Idempotent.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        let pid = Pid::from_raw(self.pid as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                tracing::debug!(component = %self.name, pid = self.pid, "stopped");
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!(component = %self.name, pid = self.pid, "did not stop on SIGTERM; killing");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Sends SIGKILL at once (simulates a crash) and reaps the process.
    pub fn kill_now(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a log file, for error messages.
pub fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(log unreadable: {e})"),
    }
}

/// Polls `poll` until it yields `Some`, or fails naming `what` after `timeout`.
pub async fn wait_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut poll: F,
) -> Result<T, TestkitError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_until_fallible(what, timeout, || {
        let next = poll();
        async move { Ok(next.await) }
    })
    .await
}

/// Like [`wait_until`], but an error from `poll` ends the wait at once (e.g. the component
/// being waited for has exited).
pub async fn wait_until_fallible<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut poll: F,
) -> Result<T, TestkitError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, TestkitError>>,
{
    let start = Instant::now();
    let mut interval = Duration::from_millis(50);
    loop {
        if let Some(v) = poll().await? {
            return Ok(v);
        }
        if start.elapsed() >= timeout {
            return Err(TestkitError::Timeout {
                what: what.to_string(),
                after: timeout,
            });
        }
        tokio::time::sleep(interval).await;
        interval = (interval * 2).min(Duration::from_millis(500));
    }
}

/// Ports handed out by this process: two components must never be given the same one.
static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

/// The kernel's range for outgoing connections' source ports. Listening ports are picked
/// below it: a port picked inside it can be taken by some client's connection before the
/// component gets to bind it.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut parts = text.split_whitespace().map(|p| p.parse::<u16>().ok());
            Some((parts.next()??, parts.next()??))
        })
        .unwrap_or((32768, 60999))
}

/// A loopback TCP port that is free now, outside the ephemeral range, and not handed out
/// before by this process.
/// A listener on a port of 127.0.0.1 the kernel picked, and that port; `what` names the
/// server in errors ("the echo BMC").
pub async fn bind_loopback(what: &str) -> Result<(tokio::net::TcpListener, u16), TestkitError> {
    let listener = tokio::net::TcpListener::bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .map_err(|source| TestkitError::Io {
            what: format!("binding a port for {what}"),
            source,
        })?;
    let port = listener
        .local_addr()
        .map_err(|source| TestkitError::Io {
            what: format!("reading the port of {what}"),
            source,
        })?
        .port();
    Ok((listener, port))
}

pub fn free_port() -> Result<u16, TestkitError> {
    use rand::Rng;
    let mut handed_out = match HANDED_OUT.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    };
    let (ephemeral_low, _) = ephemeral_range();
    let (low, high) = if ephemeral_low > 12_000 {
        (10_000, ephemeral_low - 1)
    } else {
        (ephemeral_low, 65_000)
    };
    let mut rng = rand::rng();
    for _ in 0..500 {
        let port = rng.random_range(low..=high);
        if handed_out.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.push(port);
            return Ok(port);
        }
    }
    Err(TestkitError::Other {
        what: "finding a free TCP port".into(),
        message: format!("no free port in {low}-{high} after 500 tries"),
    })
}

/// A loopback UDP port that was free a moment ago.
pub fn free_udp_port() -> Result<u16, TestkitError> {
    let socket = UdpSocket::bind("127.0.0.1:0").map_err(|source| TestkitError::Io {
        what: "finding a free UDP port".into(),
        source,
    })?;
    socket
        .local_addr()
        .map(|a| a.port())
        .map_err(|source| TestkitError::Io {
            what: "finding a free UDP port".into(),
            source,
        })
}

/// Fails with a clear message when a loopback TCP port is already taken.
pub fn ensure_port_free(component: &str, port: u16) -> Result<(), TestkitError> {
    TcpListener::bind(("127.0.0.1", port))
        .map(drop)
        .map_err(|_| TestkitError::PortInUse {
            component: component.to_string(),
            port,
        })
}

/// `$HOSTCYCLE_CACHE`, or `~/.cache/hostcycle`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HOSTCYCLE_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache").join("hostcycle")
}

/// A program in the cached Python venv (sushy-emulator, python).
pub fn venv_bin(name: &str) -> PathBuf {
    cache_dir().join("venv").join("bin").join(name)
}

/// Fails with an install hint when a required program is missing.
pub fn require_program(component: &str, path: &Path) -> Result<(), TestkitError> {
    if path.is_file() {
        Ok(())
    } else {
        Err(TestkitError::MissingBinary {
            component: component.to_string(),
            path: path.to_path_buf(),
        })
    }
}
