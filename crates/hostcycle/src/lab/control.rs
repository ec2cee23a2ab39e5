//! The running lab's control channel: `hostcycle lab kill-kubelet|partition|power-loss|heal
//! NODE` connects to a Unix socket in the lab directory and sends one line; the lab does it
//! (the simulator's faults and the emulator live in the lab process) and answers one line.
//!
//! The socket sits in a directory only its owner may enter (0700), the socket itself is 0600,
//! and the lab also checks that the peer runs as its own user. Lines are bounded both ways and
//! every read has a deadline.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use hostcycle_sim::{Fault, SimControl};
use hostcycle_testkit::bmc_emulators::{FakePower, RedfishEmulator};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::LAB_HOSTS;
use super::stream::StreamInput;

/// Longest request or answer line, newline included.
const MAX_LINE: usize = 512;
/// How long the lab waits for a client's request line.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the emulator may take to report a host Off after a power cut.
const POWER_CUT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client waits for the lab's answer (a power cut waits for the emulator).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(45);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What a client may ask the running lab to do to one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// The kubelet process dies (`Fault::KubeletDead`).
    KillKubelet,
    /// The kubelet loses the API server (`Fault::Partitioned`).
    Partition,
    /// The host loses power at its BMC, bypassing hostcycle.
    PowerLoss,
    /// The kubelet is healthy again (`Fault::None`), without a power cycle.
    Heal,
}

impl FaultAction {
    const ALL: [FaultAction; 4] = [
        FaultAction::KillKubelet,
        FaultAction::Partition,
        FaultAction::PowerLoss,
        FaultAction::Heal,
    ];

    /// The word on the wire, also the subcommand's name.
    pub fn word(self) -> &'static str {
        match self {
            FaultAction::KillKubelet => "kill-kubelet",
            FaultAction::Partition => "partition",
            FaultAction::PowerLoss => "power-loss",
            FaultAction::Heal => "heal",
        }
    }

    /// What happened, as the stream says it.
    pub fn done(self) -> &'static str {
        match self {
            FaultAction::KillKubelet => "kubelet killed",
            FaultAction::Partition => "kubelet partitioned from the API server",
            FaultAction::PowerLoss => "power lost (cut at the BMC emulator)",
            FaultAction::Heal => "kubelet healed",
        }
    }
}

/// One request: an action on one lab host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlRequest {
    pub action: FaultAction,
    pub node: String,
}

impl ControlRequest {
    /// The request line, newline included.
    pub fn to_line(&self) -> String {
        format!("{} {}\n", self.action.word(), self.node)
    }
}

/// Reads `ACTION NODE` (one space-separated pair, surrounding whitespace ignored); the node
/// must be one of the lab's hosts.
pub fn parse_request(line: &str) -> Result<ControlRequest, String> {
    if line.len() > MAX_LINE {
        return Err(format!("request longer than {MAX_LINE} bytes"));
    }
    let mut words = line.split_whitespace();
    let (Some(word), Some(node), None) = (words.next(), words.next(), words.next()) else {
        return Err("expected `ACTION NODE`".into());
    };
    let action = FaultAction::ALL
        .into_iter()
        .find(|a| a.word() == word)
        .ok_or_else(|| {
            format!(
                "unknown action {:?}; known: {}",
                bounded(word),
                FaultAction::ALL.map(FaultAction::word).join(", ")
            )
        })?;
    validate_node(node)?;
    Ok(ControlRequest {
        action,
        node: node.to_string(),
    })
}

/// `Ok` when `node` is one of the lab's hosts.
pub fn validate_node(node: &str) -> Result<(), String> {
    if LAB_HOSTS.iter().any(|(name, _)| *name == node) {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not a lab host; the lab's hosts: {}",
            bounded(node),
            LAB_HOSTS.map(|(name, _)| name).join(", ")
        ))
    }
}

/// At most 64 characters of untrusted text, for messages.
fn bounded(text: &str) -> String {
    text.chars().take(64).collect()
}

/// The socket's path inside the lab directory.
pub fn socket_path(lab_dir: &Path) -> PathBuf {
    lab_dir.join("control").join("lab.sock")
}

/// The listening socket; removes its file when dropped.
pub struct ControlSocket {
    listener: UnixListener,
    path: PathBuf,
    /// Our own user: the socket's owner.
    owner_uid: u32,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the control socket in a 0700 directory (a stale socket of a lab that died is
/// replaced: the caller holds the lab's PID file) and makes it 0600.
pub fn bind(lab_dir: &Path) -> anyhow::Result<ControlSocket> {
    use std::os::unix::fs::PermissionsExt;
    let path = socket_path(lab_dir);
    let dir = path
        .parent()
        .context("the control socket has no directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making {} owner-only", dir.display()))?;
    let _ = std::fs::remove_file(&path);
    let listener =
        UnixListener::bind(&path).with_context(|| format!("listening on {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("making {} owner-only", path.display()))?;
    let owner_uid = std::os::unix::fs::MetadataExt::uid(
        &std::fs::metadata(&path).with_context(|| format!("reading {}", path.display()))?,
    );
    Ok(ControlSocket {
        listener,
        path,
        owner_uid,
    })
}

/// What the control server acts on.
#[derive(Clone)]
pub struct LabTargets {
    pub sim: SimControl,
    pub redfish: Arc<RedfishEmulator>,
    pub stream: tokio::sync::mpsc::UnboundedSender<StreamInput>,
}

/// Serves requests until `stop` fires; each connection is handled on its own task, so a slow
/// client holds no one else up.
pub async fn serve(socket: ControlSocket, targets: LabTargets, stop: CancellationToken) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            accepted = socket.listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(handle(stream, socket.owner_uid, targets.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lab control socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            },
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.shutdown().await;
    drop(socket);
}

async fn handle(mut stream: UnixStream, owner_uid: u32, targets: LabTargets) {
    let answer = match read_request(&mut stream, owner_uid).await {
        Ok(request) => match act(&request, &targets).await {
            Ok(message) => format!("ok {message}\n"),
            Err(e) => format!("error {e:#}\n"),
        },
        Err(e) => format!("error {e:#}\n"),
    };
    let answer: String = answer.chars().take(MAX_LINE - 1).collect();
    let _ = tokio::time::timeout(REQUEST_READ_TIMEOUT, async {
        stream.write_all(answer.trim_end().as_bytes()).await?;
        stream.write_all(b"\n").await?;
        stream.shutdown().await
    })
    .await;
}

/// One bounded line from a peer of our own user, within the deadline.
async fn read_request(stream: &mut UnixStream, owner_uid: u32) -> anyhow::Result<ControlRequest> {
    let peer = stream
        .peer_cred()
        .context("reading the peer's credentials")?;
    if peer.uid() != owner_uid {
        bail!("refused: the lab serves only its own user (uid {owner_uid})");
    }
    let line = tokio::time::timeout(REQUEST_READ_TIMEOUT, read_line(stream))
        .await
        .map_err(|_| anyhow::anyhow!("no request line within {REQUEST_READ_TIMEOUT:?}"))??;
    parse_request(&line).map_err(|e| anyhow::anyhow!(e))
}

/// Reads up to a newline, at most `MAX_LINE` bytes.
async fn read_line(stream: &mut UnixStream) -> anyhow::Result<String> {
    let mut reader = BufReader::new(stream.take(MAX_LINE as u64 + 1));
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .await
        .context("reading a line (it must be UTF-8)")?;
    if line.len() > MAX_LINE {
        bail!("line longer than {MAX_LINE} bytes");
    }
    if !line.ends_with('\n') {
        bail!("incomplete line (no newline)");
    }
    Ok(line)
}

async fn act(request: &ControlRequest, targets: &LabTargets) -> anyhow::Result<String> {
    let node = request.node.as_str();
    match request.action {
        FaultAction::KillKubelet => targets.sim.set_fault(node, Fault::KubeletDead)?,
        FaultAction::Partition => targets.sim.set_fault(node, Fault::Partitioned)?,
        FaultAction::Heal => targets.sim.set_fault(node, Fault::None)?,
        FaultAction::PowerLoss => {
            let index = LAB_HOSTS
                .iter()
                .position(|(name, _)| *name == node)
                .with_context(|| format!("{node} is not a lab host"))?;
            targets
                .redfish
                .set_power(index, FakePower::Off, POWER_CUT_TIMEOUT)
                .await
                .with_context(|| format!("cutting {node}'s power at the emulator"))?;
        }
    }
    // The stream's clock starts at the fault.
    let _ = targets.stream.send(StreamInput::Fault {
        node: node.to_string(),
        action: request.action,
    });
    Ok(format!("{node}: {}", request.action.done()))
}

/// The client side: sends `request` to the running lab and returns its answer.
pub async fn send(lab_dir: &Path, request: &ControlRequest) -> anyhow::Result<String> {
    let path = socket_path(lab_dir);
    let mut stream = match tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(&path)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => bail!(
            "cannot reach the lab's control socket {}: {e}; a lab opens it once it is up (after \
             \"The hostcycle lab is up\"); is one running (`make lab`)?",
            path.display()
        ),
        Err(_) => bail!(
            "the lab's control socket {} did not accept within {CONNECT_TIMEOUT:?}",
            path.display()
        ),
    };
    stream
        .write_all(request.to_line().as_bytes())
        .await
        .context("sending the request to the lab")?;
    let line = tokio::time::timeout(ANSWER_TIMEOUT, read_line(&mut stream))
        .await
        .map_err(|_| anyhow::anyhow!("the lab did not answer within {ANSWER_TIMEOUT:?}"))??;
    match line.trim_end().split_once(' ') {
        Some(("ok", message)) => Ok(message.to_string()),
        Some(("error", message)) => bail!("the lab refused: {message}"),
        _ => bail!("unexpected answer from the lab: {:?}", bounded(&line)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The action and node parsed, or the start of the error.
    type Expected = Result<(FaultAction, &'static str), &'static str>;

    #[test]
    fn request_lines() {
        let cases: &[(&str, Expected)] = &[
            (
                "kill-kubelet worker-1\n",
                Ok((FaultAction::KillKubelet, "worker-1")),
            ),
            (
                "partition worker-2",
                Ok((FaultAction::Partition, "worker-2")),
            ),
            (
                "  power-loss   cp-0 \r\n",
                Ok((FaultAction::PowerLoss, "cp-0")),
            ),
            ("heal worker-0\n", Ok((FaultAction::Heal, "worker-0"))),
            ("", Err("expected `ACTION NODE`")),
            ("kill-kubelet\n", Err("expected `ACTION NODE`")),
            ("kill-kubelet worker-1 now\n", Err("expected `ACTION NODE`")),
            ("reboot worker-1\n", Err("unknown action \"reboot\"")),
            (
                "kill-kubelet worker-9\n",
                Err("\"worker-9\" is not a lab host"),
            ),
            ("KILL-KUBELET worker-1\n", Err("unknown action")),
        ];
        for (line, expected) in cases {
            let got = parse_request(line);
            match expected {
                Ok((action, node)) => assert_eq!(
                    got,
                    Ok(ControlRequest {
                        action: *action,
                        node: node.to_string()
                    }),
                    "{line:?}"
                ),
                Err(prefix) => {
                    let error = got.expect_err(line);
                    assert!(error.starts_with(prefix), "{line:?}: {error}");
                }
            }
        }
    }

    #[test]
    fn long_lines_are_refused_and_requests_round_trip() {
        let long = format!("kill-kubelet {}\n", "w".repeat(MAX_LINE));
        assert!(parse_request(&long).is_err());
        for action in FaultAction::ALL {
            let request = ControlRequest {
                action,
                node: "worker-1".into(),
            };
            assert_eq!(parse_request(&request.to_line()), Ok(request));
        }
    }
}
