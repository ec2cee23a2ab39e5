//! The one interface every BMC driver implements.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;

use crate::credentials::BmcCredentials;
use crate::error::BmcError;
use crate::text::Secrets;

/// A host's power state as the BMC reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerState {
    On,
    Off,
    /// Powering on or off (Redfish `PoweringOn`/`PoweringOff`, or a reboot in progress).
    Transitioning,
    /// The BMC did not say, or said something this layer does not understand.
    Unknown,
}

impl fmt::Display for PowerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PowerState::On => "on",
            PowerState::Off => "off",
            PowerState::Transitioning => "transitioning",
            PowerState::Unknown => "unknown",
        })
    }
}

/// One power reading and the identity of the BMC that made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PowerReading {
    pub state: PowerState,
    /// What the BMC says it is (Redfish `uuid:<System UUID>`, else `serial:<SerialNumber>`),
    /// when it says: bounded and limited to `[0-9A-Za-z._:-]`, so it is safe in a status.
    pub identity: Option<String>,
}

/// The longest identity kept from a BMC; longer ones are not an identity.
pub const MAX_IDENTITY: usize = 96;

/// `kind:value` when `value` is a plausible identifier (bounded, plain characters), else
/// `None`: a hostile BMC's text never reaches a status through it.
pub fn identity_of(kind: &str, value: Option<&str>) -> Option<String> {
    let value = value?.trim();
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    (!value.is_empty() && value.len() + kind.len() < MAX_IDENTITY && value.chars().all(plain))
        .then(|| format!("{kind}:{value}"))
}

/// How to power off: `Soft` asks the OS to shut down (ACPI), `Hard` cuts power.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerOffMode {
    #[default]
    Soft,
    Hard,
}

impl fmt::Display for PowerOffMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PowerOffMode::Soft => "soft",
            PowerOffMode::Hard => "hard",
        })
    }
}

/// What was asked of the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "operation", content = "mode")]
pub enum PowerRequest {
    On,
    Off(PowerOffMode),
    Reboot(PowerOffMode),
}

impl fmt::Display for PowerRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PowerRequest::On => f.write_str("power on"),
            PowerRequest::Off(mode) => write!(f, "{mode} power off"),
            PowerRequest::Reboot(mode) => write!(f, "{mode} reboot"),
        }
    }
}

/// What a driver did for a power request, for status, events and logs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PowerOutcome {
    pub request: PowerRequest,
    /// What was sent to the BMC: `ResetType=GracefulShutdown`, `chassis power soft`,
    /// `reboot command`... `None` when nothing was sent because the host already was in the
    /// requested state.
    pub action: Option<String>,
    /// Set when a soft request was carried out hard, with the reason (soft not offered by the
    /// BMC, or rejected by it).
    pub hard_fallback: Option<String>,
    /// Output of an external command, trimmed, for events.
    pub output: Option<String>,
}

impl PowerOutcome {
    pub fn sent(request: PowerRequest, action: impl Into<String>) -> Self {
        PowerOutcome {
            request,
            action: Some(action.into()),
            hard_fallback: None,
            output: None,
        }
    }

    pub fn already_done(request: PowerRequest) -> Self {
        PowerOutcome {
            request,
            action: None,
            hard_fallback: None,
            output: None,
        }
    }

    /// The outcome with its texts cut to about 1 KiB ([`crate::text::clip`]): they may quote
    /// the BMC and end up in a host's status and Events.
    pub fn bounded(mut self) -> Self {
        for text in [&mut self.action, &mut self.hard_fallback, &mut self.output]
            .into_iter()
            .flatten()
        {
            crate::text::clip_in_place(text);
        }
        self
    }

    /// The outcome without the password in its texts ([`crate::text::scrub_secret`]): the
    /// reason of a hard fallback may list what the BMC sent (its reset types, its error).
    pub fn scrubbed(self, username: &str, password: &str) -> Self {
        self.scrubbed_of(&crate::text::Secrets::new(username, password))
    }

    /// [`PowerOutcome::scrubbed`] for all the secrets of a connection (session tokens too).
    pub fn scrubbed_of(mut self, secrets: &crate::text::Secrets<'_>) -> Self {
        for text in [&mut self.action, &mut self.hard_fallback, &mut self.output]
            .into_iter()
            .flatten()
        {
            let clean = crate::text::scrub(text, secrets);
            if clean != *text {
                *text = clean;
            }
        }
        self
    }

    pub fn fell_back_to_hard(&self) -> bool {
        self.hard_fallback.is_some()
    }
}

impl fmt::Display for PowerOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.action {
            None => write!(f, "{}: nothing to do, already in that state", self.request)?,
            Some(action) => write!(f, "{}: sent {action}", self.request)?,
        }
        if let Some(reason) = &self.hard_fallback {
            write!(f, " (hard instead of soft: {reason})")?;
        }
        Ok(())
    }
}

/// Which kind of driver talks to a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DriverKind {
    Redfish,
    Ipmi,
    Command,
}

impl fmt::Display for DriverKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DriverKind::Redfish => "redfish",
            DriverKind::Ipmi => "ipmi",
            DriverKind::Command => "command",
        })
    }
}

/// A driver's self-description for status and logs. Never contains credentials.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DriverDescription {
    pub kind: DriverKind,
    /// Where it connects: `https://10.0.0.5:443`, `ipmi://10.0.0.6:623`, or the node name.
    pub endpoint: String,
    /// Driver-specific detail: System path, cipher suite, command...
    pub detail: String,
}

impl fmt::Display for DriverDescription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind, self.endpoint)?;
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        Ok(())
    }
}

/// Power control of one host. Every method has a deadline (set by the driver's options) and
/// retries transient failures; permanent failures return at once.
///
/// Drivers are cheap to share: the operator keeps one `Arc<dyn PowerDriver>` per host.
#[async_trait]
pub trait PowerDriver: Send + Sync + fmt::Debug {
    /// What this driver talks to, for status and logs.
    fn description(&self) -> DriverDescription;

    /// Reads the power state.
    async fn power_state(&self) -> Result<PowerState, BmcError>;

    /// Reads the power state with the identity of the BMC that answered (for the evidence
    /// fencing trusts). Drivers that cannot tell their BMC's identity return `None` for it.
    async fn power_reading(&self) -> Result<PowerReading, BmcError> {
        Ok(PowerReading {
            state: self.power_state().await?,
            identity: None,
        })
    }

    /// Powers the host on. Doing nothing when it is already on is success.
    async fn power_on(&self) -> Result<PowerOutcome, BmcError>;

    /// Powers the host off. A soft request that the BMC does not offer or rejects is carried
    /// out hard at once, and the outcome says so. Waiting for the host to actually go off, and
    /// the soft→hard fallback after a timeout, are in [`crate::soft_off`].
    async fn power_off(&self, mode: PowerOffMode) -> Result<PowerOutcome, BmcError>;

    /// Restarts the host (Redfish `GracefulRestart`/`ForceRestart`, IPMI `chassis power
    /// reset`, or the command driver's reboot command).
    async fn reboot(&self, mode: PowerOffMode) -> Result<PowerOutcome, BmcError>;

    /// Logs out of the BMC (closes a Redfish session), within the call deadline. A process
    /// calls it before it exits: dropping a driver only starts a logout, which an exiting
    /// process does not finish, and BMCs have few session slots. Calls made afterwards log in
    /// again. Drivers that hold nothing open do nothing.
    async fn close(&self) -> Result<(), BmcError> {
        Ok(())
    }
}

/// A driver's raw exchanges with its BMC. Every type that implements it is a
/// [`PowerDriver`] whose calls are each bounded by [`BmcOperations::call_deadline`].
#[async_trait]
pub trait BmcOperations: Send + Sync + fmt::Debug {
    /// What this driver talks to, for status and logs.
    fn describe(&self) -> DriverDescription;
    /// The deadline of one call, covering all its retries.
    fn call_deadline(&self) -> std::time::Duration;
    /// The credentials the driver sends, if any: their password is scrubbed from every error
    /// and outcome the driver returns, whatever the BMC put where.
    fn credentials(&self) -> Option<&BmcCredentials> {
        None
    }
    /// The session tokens the BMC handed out (the current one and a few before it): scrubbed
    /// like the password.
    fn session_tokens(&self) -> Vec<Arc<str>> {
        Vec::new()
    }
    async fn read_power_state(&self) -> Result<PowerState, BmcError>;
    /// [`BmcOperations::read_power_state`] with the BMC's identity, where the driver reads one.
    async fn read_power_reading(&self) -> Result<PowerReading, BmcError> {
        Ok(PowerReading {
            state: self.read_power_state().await?,
            identity: None,
        })
    }
    async fn request_power_on(&self) -> Result<PowerOutcome, BmcError>;
    async fn request_power_off(&self, mode: PowerOffMode) -> Result<PowerOutcome, BmcError>;
    async fn request_reboot(&self, mode: PowerOffMode) -> Result<PowerOutcome, BmcError>;
    /// Ends what the driver holds open on the BMC (a Redfish session); see
    /// [`PowerDriver::close`].
    async fn end_session(&self) -> Result<(), BmcError> {
        Ok(())
    }
}

#[async_trait]
impl<T: BmcOperations> PowerDriver for T {
    fn description(&self) -> DriverDescription {
        self.describe()
    }

    async fn power_state(&self) -> Result<PowerState, BmcError> {
        let what = || format!("reading the power state of {}", self.describe());
        within(self.call_deadline(), what, self.read_power_state())
            .await
            .map_err(|e| contained_error(e, self))
    }

    async fn power_reading(&self) -> Result<PowerReading, BmcError> {
        let what = || format!("reading the power state of {}", self.describe());
        within(self.call_deadline(), what, self.read_power_reading())
            .await
            .map_err(|e| contained_error(e, self))
    }

    async fn power_on(&self) -> Result<PowerOutcome, BmcError> {
        let what = || format!("power on of {}", self.describe());
        contained(
            within(self.call_deadline(), what, self.request_power_on()).await,
            self,
        )
    }

    async fn power_off(&self, mode: PowerOffMode) -> Result<PowerOutcome, BmcError> {
        let what = || format!("{mode} power off of {}", self.describe());
        contained(
            within(self.call_deadline(), what, self.request_power_off(mode)).await,
            self,
        )
    }

    async fn reboot(&self, mode: PowerOffMode) -> Result<PowerOutcome, BmcError> {
        let what = || format!("{mode} reboot of {}", self.describe());
        contained(
            within(self.call_deadline(), what, self.request_reboot(mode)).await,
            self,
        )
    }

    async fn close(&self) -> Result<(), BmcError> {
        let what = || format!("logging out of {}", self.describe());
        within(self.call_deadline(), what, self.end_session())
            .await
            .map_err(|e| contained_error(e, self))
    }
}

/// An error fit to leave the driver: without the password and session tokens, then cut
/// (scrubbing first, so a cut never leaves part of a secret behind).
fn contained_error<D: BmcOperations + ?Sized>(error: BmcError, driver: &D) -> BmcError {
    match driver.credentials() {
        Some(c) => {
            let tokens = driver.session_tokens();
            let secrets = Secrets::new(c.username(), c.password()).with_tokens(&tokens);
            error.scrubbed_of(&secrets).bounded()
        }
        None => error.bounded(),
    }
}

/// A power call's result fit to leave the driver (see [`contained_error`]).
fn contained<D: BmcOperations + ?Sized>(
    result: Result<PowerOutcome, BmcError>,
    driver: &D,
) -> Result<PowerOutcome, BmcError> {
    match result {
        Ok(outcome) => Ok(match driver.credentials() {
            Some(c) => {
                let tokens = driver.session_tokens();
                let secrets = Secrets::new(c.username(), c.password()).with_tokens(&tokens);
                outcome.scrubbed_of(&secrets).bounded()
            }
            None => outcome.bounded(),
        }),
        Err(e) => Err(contained_error(e, driver)),
    }
}

/// Runs a driver call with a deadline covering all its exchanges with the BMC.
pub(crate) async fn within<T>(
    deadline: std::time::Duration,
    what: impl FnOnce() -> String,
    call: impl std::future::Future<Output = Result<T, BmcError>>,
) -> Result<T, BmcError> {
    match tokio::time::timeout(deadline, call).await {
        Ok(result) => result,
        Err(_) => Err(BmcError::Timeout {
            what: what(),
            after: deadline,
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;

    const PASSWORD: &str = "Sekr1t-xyzzy-4242";

    /// A driver whose BMC repeats the password in everything it answers.
    #[derive(Debug)]
    struct Echoing {
        credentials: Option<BmcCredentials>,
    }

    fn echoed() -> String {
        format!("the BMC says {PASSWORD} and /redfish/v1/Sessions/Sekr1t%2Dxyzzy%2D4242")
    }

    #[async_trait]
    impl BmcOperations for Echoing {
        fn describe(&self) -> DriverDescription {
            DriverDescription {
                kind: DriverKind::Redfish,
                endpoint: "http://bmc:80".into(),
                detail: String::new(),
            }
        }
        fn call_deadline(&self) -> Duration {
            Duration::from_secs(5)
        }
        fn credentials(&self) -> Option<&BmcCredentials> {
            self.credentials.as_ref()
        }
        async fn read_power_state(&self) -> Result<PowerState, BmcError> {
            Err(BmcError::RetriesExhausted {
                operation: echoed(),
                attempts: 2,
                elapsed: Duration::from_secs(1),
                last: Box::new(BmcError::InvalidResponse {
                    endpoint: "http://bmc:80".into(),
                    path: echoed(),
                    detail: echoed(),
                }),
            })
        }
        async fn request_power_on(&self) -> Result<PowerOutcome, BmcError> {
            Ok(PowerOutcome {
                request: PowerRequest::On,
                action: Some(echoed()),
                hard_fallback: Some(echoed()),
                output: Some(echoed()),
            })
        }
        async fn request_power_off(&self, _: PowerOffMode) -> Result<PowerOutcome, BmcError> {
            Err(BmcError::Unsupported {
                driver: "redfish".into(),
                operation: "soft power off".into(),
                reason: echoed(),
            })
        }
        async fn request_reboot(&self, _: PowerOffMode) -> Result<PowerOutcome, BmcError> {
            self.request_power_off(PowerOffMode::Soft).await
        }
        async fn end_session(&self) -> Result<(), BmcError> {
            Err(BmcError::Http {
                endpoint: "http://bmc:80".into(),
                method: "DELETE".into(),
                path: echoed(),
                status: 500,
                message: echoed(),
                retry_after: None,
            })
        }
    }

    #[tokio::test]
    async fn what_a_driver_with_credentials_returns_never_holds_the_password() {
        let driver = Echoing {
            credentials: Some(BmcCredentials::new("admin", PASSWORD).unwrap()),
        };
        let texts = [
            format!("{:?}", driver.power_state().await),
            format!("{:?}", driver.power_on().await),
            format!("{}", driver.power_on().await.unwrap()),
            format!("{:?}", driver.power_off(PowerOffMode::Soft).await),
            format!("{:?}", driver.reboot(PowerOffMode::Hard).await),
            format!("{:?}", driver.close().await),
        ];
        for text in texts {
            assert!(!text.contains("Sekr1t"), "{text}");
            assert!(text.contains("<redacted>"), "{text}");
        }
        // A driver without credentials (the command driver) returns its texts as they are.
        let plain = Echoing { credentials: None };
        assert!(
            format!("{:?}", plain.power_on().await).contains(PASSWORD),
            "nothing to scrub"
        );
    }

    #[test]
    fn outcomes_are_scrubbed_in_every_text() {
        let outcome = PowerOutcome {
            request: PowerRequest::Off(PowerOffMode::Soft),
            action: Some(format!("ResetType={PASSWORD}")),
            hard_fallback: Some(format!("allowed: [On, {PASSWORD}]")),
            output: Some(format!("echo {PASSWORD}")),
        }
        .scrubbed("admin", PASSWORD);
        let text = format!("{outcome} {outcome:?}");
        assert!(!text.contains("Sekr1t"), "{text}");
        assert_eq!(
            outcome.hard_fallback.as_deref(),
            Some("allowed: [On, <redacted>]")
        );
    }
}
