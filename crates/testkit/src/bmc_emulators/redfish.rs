//! sushy-tools' Redfish emulator with the fake systems driver.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{DEFAULT_START_TIMEOUT, FakePower, other, py_str};
use crate::TestkitError;
use crate::pki::TestCa;
use crate::process::{ManagedProcess, free_port, log_tail, require_program, venv_bin};

/// One emulated host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeSystem {
    /// The System's id in Redfish URLs (`/redfish/v1/Systems/<uuid>`).
    pub uuid: String,
    pub name: String,
    pub power_state: FakePower,
}

impl FakeSystem {
    /// A system with a fresh random UUID.
    pub fn new(name: impl Into<String>, power_state: FakePower) -> Self {
        let bytes: [u8; 16] = rand::random();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let uuid = format!(
            "{}-{}-4{}-a{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[13..16],
            &hex[17..20],
            &hex[20..32]
        );
        FakeSystem {
            uuid,
            name: name.into(),
            power_state,
        }
    }
}

/// What to start.
#[derive(Clone, Debug)]
pub struct RedfishEmulatorOptions {
    pub systems: Vec<FakeSystem>,
    /// Require HTTP basic auth with this user and password.
    pub basic_auth: Option<(String, String)>,
    /// More accounts (user, password) accepted besides `basic_auth` (which must be set), e.g.
    /// one per host so that each host's credentials are distinct.
    pub extra_users: Vec<(String, String)>,
    /// Serve HTTPS with a certificate from a fresh test CA (see [`RedfishEmulator::ca_pem`]).
    pub tls: bool,
    /// A fixed port (the lab); a free one when `None`.
    pub port: Option<u16>,
    pub start_timeout: Duration,
}

impl Default for RedfishEmulatorOptions {
    fn default() -> Self {
        RedfishEmulatorOptions {
            systems: vec![FakeSystem::new("host-0", FakePower::Off)],
            basic_auth: None,
            extra_users: Vec::new(),
            tls: false,
            port: None,
            start_timeout: DEFAULT_START_TIMEOUT,
        }
    }
}

/// A running sushy-emulator. Dropping it stops the process (by PID) and removes its files.
pub struct RedfishEmulator {
    process: ManagedProcess,
    // Dropped after `process` (fields drop in order), so the state dir outlives the server.
    dir: tempfile::TempDir,
    port: u16,
    tls: bool,
    ca_pem: Option<String>,
    systems: Vec<FakeSystem>,
    basic_auth: Option<(String, String)>,
    http: reqwest::Client,
}

impl std::fmt::Debug for RedfishEmulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedfishEmulator")
            .field("endpoint", &self.endpoint())
            .field("pid", &self.process.pid())
            .field("systems", &self.systems.len())
            .finish_non_exhaustive()
    }
}

impl RedfishEmulator {
    /// Starts sushy-emulator and waits until it answers.
    pub async fn start(options: RedfishEmulatorOptions) -> Result<RedfishEmulator, TestkitError> {
        let program = venv_bin("sushy-emulator");
        require_program("sushy-emulator (Redfish emulator)", &program)?;
        if options.systems.is_empty() {
            return Err(other(
                "starting sushy-emulator",
                "at least one system is needed",
            ));
        }
        let dir = tempfile::Builder::new()
            .prefix("sushy-")
            .tempdir()
            .map_err(|source| TestkitError::Io {
                what: "creating a temp dir".into(),
                source,
            })?;
        let ca_pem = options
            .tls
            .then(|| write_tls_files(dir.path()))
            .transpose()?;
        if let Some(account) = &options.basic_auth {
            let accounts: Vec<&(String, String)> = std::iter::once(account)
                .chain(&options.extra_users)
                .collect();
            write_htpasswd(&dir.path().join("htpasswd"), &accounts)?;
        }
        let http = crate::http::client(ca_pem.as_deref())?;

        // A free port can be taken by someone else before sushy binds it; try a few.
        let attempts = if options.port.is_some() { 1 } else { 3 };
        for attempt in 1..=attempts {
            let port = match options.port {
                Some(port) => port,
                None => free_port()?,
            };
            let config = dir.path().join("emulator.conf");
            write_config(&config, dir.path(), port, &options)?;
            let mut command = Command::new(&program);
            command
                .arg("--config")
                .arg(&config)
                .env("PYTHONUNBUFFERED", "1");
            let mut process = ManagedProcess::spawn("sushy-emulator", command, dir.path())?;
            let endpoint = endpoint(port, options.tls);
            match wait_ready(&mut process, &http, &endpoint, options.start_timeout).await {
                Ok(()) => {
                    tracing::debug!(%endpoint, pid = process.pid(), "sushy-emulator ready");
                    return Ok(RedfishEmulator {
                        process,
                        dir,
                        port,
                        tls: options.tls,
                        ca_pem,
                        systems: options.systems,
                        basic_auth: options.basic_auth,
                        http,
                    });
                }
                Err(e) => {
                    let port_taken =
                        log_tail(process.log_path(), 20).contains("Address already in use");
                    drop(process);
                    if !port_taken || attempt == attempts {
                        return Err(e);
                    }
                }
            }
        }
        Err(other("starting sushy-emulator", "no attempt was made"))
    }

    /// `https://127.0.0.1:PORT` or `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        endpoint(self.port, self.tls)
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

    /// The emulator's files (config, state, certificates).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn systems(&self) -> &[FakeSystem] {
        &self.systems
    }

    /// The CA that signed the emulator's certificate (PEM), when serving TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The path of system `index`: `/redfish/v1/Systems/<uuid>`.
    pub fn system_path(&self, index: usize) -> Result<String, TestkitError> {
        let system = self.systems.get(index).ok_or_else(|| {
            other(
                "looking up an emulated system",
                format!("no system #{index} (there are {})", self.systems.len()),
            )
        })?;
        Ok(format!("/redfish/v1/Systems/{}", system.uuid))
    }

    /// A BMC address for system `index` (metal3 syntax): `redfish://127.0.0.1:PORT/...` with
    /// TLS, `redfish+http://127.0.0.1:PORT/...` without.
    pub fn system_address(&self, index: usize) -> Result<String, TestkitError> {
        let scheme = if self.tls { "redfish" } else { "redfish+http" };
        Ok(format!(
            "{scheme}://127.0.0.1:{}{}",
            self.port,
            self.system_path(index)?
        ))
    }

    /// Reads system `index`'s `PowerState` straight from the emulator (`On`, `Off`...).
    pub async fn power_state(&self, index: usize) -> Result<String, TestkitError> {
        let url = format!("{}{}", self.endpoint(), self.system_path(index)?);
        let what = format!("GET {url}");
        let response = self
            .authorized(self.http.get(&url))
            .send()
            .await
            .map_err(|e| other(&what, e))?;
        let status = response.status();
        let body: serde_json::Value = response.json().await.map_err(|e| other(&what, e))?;
        if !status.is_success() {
            return Err(other(&what, format!("HTTP {status}: {body}")));
        }
        body.get("PowerState")
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .ok_or_else(|| other(&what, format!("no PowerState in {body}")))
    }

    /// Waits until system `index` reports `expected` (the fake driver applies changes 1–11 s
    /// after a request).
    pub async fn wait_for_power(
        &self,
        index: usize,
        expected: FakePower,
        timeout: Duration,
    ) -> Result<(), TestkitError> {
        let what = format!(
            "emulated system #{index} at {} to be {}",
            self.endpoint(),
            expected.redfish()
        );
        crate::wait_until(&what, timeout, || async {
            match self.power_state(index).await {
                Ok(state) if state == expected.redfish() => Some(()),
                _ => None,
            }
        })
        .await
    }

    /// Sends `ComputerSystem.Reset` with `reset_type` to system `index` directly.
    pub async fn reset(&self, index: usize, reset_type: &str) -> Result<(), TestkitError> {
        let url = format!(
            "{}{}/Actions/ComputerSystem.Reset",
            self.endpoint(),
            self.system_path(index)?
        );
        let what = format!("POST {url} ResetType={reset_type}");
        let response = self
            .authorized(self.http.post(&url))
            .json(&serde_json::json!({ "ResetType": reset_type }))
            .send()
            .await
            .map_err(|e| other(&what, e))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(other(&what, format!("HTTP {}", response.status())))
        }
    }

    /// Sets system `index`'s power directly at the emulator, bypassing hostcycle (`ForceOff`
    /// for [`FakePower::Off`]: a power cut, no shutdown), and waits up to `timeout` until the
    /// emulator reports it (its fake driver applies a change 1–11 s after the request).
    pub async fn set_power(
        &self,
        index: usize,
        power: FakePower,
        timeout: Duration,
    ) -> Result<(), TestkitError> {
        let reset_type = match power {
            FakePower::On => "On",
            FakePower::Off => "ForceOff",
        };
        self.reset(index, reset_type).await?;
        self.wait_for_power(index, power, timeout).await
    }

    /// Errors naming the emulator and its log if it has exited.
    pub fn ensure_running(&mut self) -> Result<(), TestkitError> {
        self.process.ensure_running()
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.basic_auth {
            Some((user, password)) => request.basic_auth(user, Some(password)),
            None => request,
        }
    }
}

fn endpoint(port: u16, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://127.0.0.1:{port}")
}

/// Polls the service root (which needs no auth) until it answers, failing early if the
/// process exits.
async fn wait_ready(
    process: &mut ManagedProcess,
    http: &reqwest::Client,
    endpoint: &str,
    timeout: Duration,
) -> Result<(), TestkitError> {
    let url = format!("{endpoint}/redfish/v1/");
    let start = Instant::now();
    loop {
        process.ensure_running()?;
        if let Ok(response) = http.get(&url).send().await
            && response.status().is_success()
        {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(TestkitError::Timeout {
                what: format!(
                    "sushy-emulator to answer on {url} (log: {})",
                    process.log_path().display()
                ),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn write_tls_files(dir: &Path) -> Result<String, TestkitError> {
    let ca = TestCa::new("hostcycle test BMC CA")?;
    ca.write_server_cert(dir, "sushy", &["127.0.0.1", "localhost", "::1"])?;
    Ok(ca.cert_pem())
}

/// An htpasswd file with a bcrypt hash per account, made by the venv's bcrypt (cost 4: every
/// request is checked against it, and tests make many). The passwords go to Python through its
/// standard input, never its command line or environment.
fn write_htpasswd(path: &Path, accounts: &[&(String, String)]) -> Result<(), TestkitError> {
    use std::io::Write as _;
    let python = venv_bin("python");
    require_program("python (venv)", &python)?;
    let input = serde_json::to_vec(
        &accounts
            .iter()
            .map(|(_, password)| password.as_str())
            .collect::<Vec<_>>(),
    )
    .map_err(|e| other("encoding the emulator passwords", e))?;
    let spawn_error = |source| TestkitError::Spawn {
        component: "bcrypt hash".into(),
        program: python.display().to_string(),
        source,
    };
    let mut child = Command::new(&python)
        .args([
            "-c",
            "import bcrypt, json, sys\n\
             for pw in json.load(sys.stdin):\n    \
             print(bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=4)).decode())",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(&input).map_err(|source| TestkitError::Io {
            what: "handing the emulator passwords to bcrypt".into(),
            source,
        })?;
    }
    let output = child.wait_with_output().map_err(spawn_error)?;
    if !output.status.success() {
        return Err(other(
            "hashing the emulator passwords with bcrypt",
            String::from_utf8_lossy(&output.stderr),
        ));
    }
    let hashes: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .collect();
    if hashes.len() != accounts.len() {
        return Err(other(
            "hashing the emulator passwords with bcrypt",
            format!("{} hashes for {} accounts", hashes.len(), accounts.len()),
        ));
    }
    let lines: String = accounts
        .iter()
        .zip(hashes)
        .map(|((user, _), hash)| format!("{user}:{hash}\n"))
        .collect();
    crate::pki::write_private(path, &lines)
}

fn write_config(
    path: &Path,
    dir: &Path,
    port: u16,
    options: &RedfishEmulatorOptions,
) -> Result<(), TestkitError> {
    let path_str = |p: PathBuf| py_str(&p.display().to_string());
    let systems: Vec<String> = options
        .systems
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "    {{'uuid': {}, 'name': {}, 'power_state': {}, 'nics': [{{'mac': {}, 'ip': {}}}]}},",
                py_str(&s.uuid),
                py_str(&s.name),
                py_str(s.power_state.redfish()),
                py_str(&format!("00:5c:52:31:{:02x}:{:02x}", (i >> 8) & 0xff, i & 0xff)),
                py_str(&format!("172.22.{}.{}", 130 + (i / 250), 10 + (i % 250))),
            )
        })
        .collect();
    let mut config = format!(
        "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n\
         SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
         SUSHY_EMULATOR_FAKE_DRIVER = True\n\
         SUSHY_EMULATOR_STATE_DIR = {state}\n\
         SUSHY_EMULATOR_FAKE_SYSTEMS = [\n{systems}\n]\n",
        state = path_str(dir.join("state")),
        systems = systems.join("\n"),
    );
    if options.basic_auth.is_some() {
        config += &format!(
            "SUSHY_EMULATOR_AUTH_FILE = {}\n",
            path_str(dir.join("htpasswd"))
        );
    }
    if options.tls {
        config += &format!(
            "SUSHY_EMULATOR_SSL_CERT = {}\nSUSHY_EMULATOR_SSL_KEY = {}\n",
            path_str(dir.join("sushy.crt")),
            path_str(dir.join("sushy.key")),
        );
    }
    crate::pki::write_private(path, &config)
}
