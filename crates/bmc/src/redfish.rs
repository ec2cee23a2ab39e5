//! The Redfish driver: reqwest + rustls (ring), basic or session auth, retries with backoff,
//! bounded concurrency per BMC endpoint, and no redirects to other hosts.

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use tokio::sync::{Mutex, OnceCell, Semaphore};
use url::Url;

use crate::address::{RedfishAddress, RedfishFlavor, endpoint_of};
use crate::bounded::{self, BodyError};
use crate::credentials::BmcCredentials;
use crate::driver::{
    BmcOperations, DriverDescription, DriverKind, PowerDriver, PowerOffMode, PowerOutcome,
    PowerReading, PowerRequest, PowerState,
};
use crate::error::BmcError;
use crate::retry::{RetryPolicy, parse_retry_after, with_retries};
use crate::text;
use crate::tls::find_tls_error;

mod reset_types;
mod session;

/// Where Redfish services keep their sessions (DSP0266 §13.3).
const SESSIONS_PATH: &str = "/redfish/v1/SessionService/Sessions";
const SYSTEMS_PATH: &str = "/redfish/v1/Systems";
const X_AUTH_TOKEN: &str = "X-Auth-Token";
/// Session tokens remembered for scrubbing: the current one and a few before it (a logout's
/// or an expired session's error may quote its token after the driver let go of it).
const REMEMBERED_TOKENS: usize = 4;
/// Longest BMC error text kept in an error message.
const MAX_MESSAGE_BYTES: usize = 300;

/// How the driver authenticates.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum RedfishAuthMode {
    /// Try a session; use basic auth when the BMC has no SessionService (like metal3/sushy).
    #[default]
    Auto,
    /// HTTP basic auth on every request.
    Basic,
    /// `X-Auth-Token` from a session; re-login when the session expires.
    Session,
}

/// Per-driver knobs.
#[derive(Clone, Debug)]
pub struct RedfishOptions {
    pub auth: RedfishAuthMode,
    /// Timeout of one HTTP request (also set on the shared client; kept here for messages).
    pub request_timeout: Duration,
    /// Retries and the deadline of each exchange with the BMC.
    pub retry: RetryPolicy,
    /// Largest response body read from the BMC; a larger one is an error (see [`bounded`]).
    pub max_body_bytes: usize,
}

impl Default for RedfishOptions {
    fn default() -> Self {
        RedfishOptions {
            auth: RedfishAuthMode::Auto,
            request_timeout: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            max_body_bytes: bounded::DEFAULT_MAX_BODY_BYTES,
        }
    }
}

#[derive(Clone)]
enum AuthState {
    Unresolved,
    Basic,
    Session {
        token: Arc<str>,
        location: Option<Url>,
    },
}

#[derive(Clone)]
enum Auth {
    Basic,
    Token(Arc<str>),
}

/// The answer to one request.
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// Why a redirect was not followed; found again in reqwest's error chain.
#[derive(Debug)]
struct CrossHostRedirect {
    target: String,
}

impl fmt::Display for CrossHostRedirect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "redirect to another host ({}) refused", self.target)
    }
}

impl std::error::Error for CrossHostRedirect {}

/// The redirect policy of every Redfish client: refuse other hosts; hand redirects within the
/// same scheme, host and port (sushy and some BMCs redirect System names to ids, some every path
/// to its trailing-slash form) to the driver, which follows them keeping the method, body and
/// credentials (see `send_following`).
pub(crate) fn redirect_policy() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let Some(first) = attempt.previous().first() else {
            return attempt.follow();
        };
        if endpoint_of(first) != endpoint_of(attempt.url()) {
            let target = endpoint_of(attempt.url());
            return attempt.error(CrossHostRedirect { target });
        }
        attempt.stop()
    })
}

/// A Redfish System's power controls.
pub struct RedfishDriver {
    address: RedfishAddress,
    endpoint: String,
    http: reqwest::Client,
    permits: Arc<Semaphore>,
    credentials: BmcCredentials,
    options: RedfishOptions,
    auth: RwLock<AuthState>,
    /// The last [`REMEMBERED_TOKENS`] session tokens, newest last: scrubbed from BMC text.
    tokens: RwLock<Vec<Arc<str>>>,
    /// Serialises logins so concurrent calls do not open several sessions.
    login_lock: Mutex<()>,
    system_path: OnceCell<String>,
}

impl fmt::Debug for RedfishDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedfishDriver")
            .field("endpoint", &self.endpoint)
            .field("system_path", &self.address.system_path)
            .field("auth", &self.options.auth)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

/// The parts of a ComputerSystem this driver reads.
#[derive(Debug, Deserialize)]
struct SystemResource {
    #[serde(rename = "PowerState")]
    power_state: Option<String>,
    /// The System's identity (evidence that readings come from the same machine).
    #[serde(rename = "UUID", default, deserialize_with = "short_text")]
    uuid: Option<String>,
    #[serde(rename = "SerialNumber", default, deserialize_with = "short_text")]
    serial_number: Option<String>,
    #[serde(rename = "Actions")]
    actions: Option<SystemActions>,
}

/// A string field kept only when it is a short string (anything else reads as absent, never
/// as a failure of the whole System).
fn short_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    Ok(match value {
        serde_json::Value::String(s) if s.len() <= crate::driver::MAX_IDENTITY => Some(s),
        _ => None,
    })
}

impl SystemResource {
    /// `uuid:<UUID>`, else `serial:<SerialNumber>`, when the BMC reports either.
    fn identity(&self) -> Option<String> {
        crate::driver::identity_of("uuid", self.uuid.as_deref())
            .or_else(|| crate::driver::identity_of("serial", self.serial_number.as_deref()))
    }
}

#[derive(Debug, Deserialize)]
struct SystemActions {
    #[serde(rename = "#ComputerSystem.Reset")]
    reset: Option<ResetAction>,
}

#[derive(Debug, Deserialize)]
struct ResetAction {
    target: Option<String>,
    #[serde(rename = "ResetType@Redfish.AllowableValues")]
    allowable_values: Option<Vec<String>>,
    #[serde(rename = "@Redfish.ActionInfo")]
    action_info: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Collection {
    #[serde(rename = "Members", default)]
    members: Vec<Link>,
}

#[derive(Debug, Deserialize)]
struct Link {
    #[serde(rename = "@odata.id")]
    odata_id: String,
}

/// Reset target and allowed reset types of a System.
struct ResetInfo {
    target: String,
    /// `None` when the BMC does not advertise them.
    allowed: Option<Vec<String>>,
}

impl ResetInfo {
    fn allows(&self, reset_type: &str) -> bool {
        self.allowed
            .as_ref()
            .is_none_or(|allowed| allowed.iter().any(|a| a == reset_type))
    }

    fn first_allowed<'a>(&self, candidates: &[&'a str]) -> Option<&'a str> {
        candidates.iter().copied().find(|c| self.allows(c))
    }

    /// The allowed types for messages, cut to about 1 KiB (a BMC may list thousands).
    fn allowed_list(&self) -> String {
        match &self.allowed {
            Some(list) => text::clip(&format!("[{}]", list.join(", "))),
            None => "(not advertised)".into(),
        }
    }
}

impl RedfishDriver {
    /// A driver using a shared client (connection pool) and the endpoint's permit pool.
    pub fn new(
        address: RedfishAddress,
        credentials: BmcCredentials,
        http: reqwest::Client,
        permits: Arc<Semaphore>,
        options: RedfishOptions,
    ) -> Self {
        let endpoint = address.endpoint();
        let auth = match options.auth {
            RedfishAuthMode::Basic => AuthState::Basic,
            _ => AuthState::Unresolved,
        };
        RedfishDriver {
            address,
            endpoint,
            http,
            permits,
            credentials,
            options,
            auth: RwLock::new(auth),
            tokens: RwLock::default(),
            login_lock: Mutex::new(()),
            system_path: OnceCell::new(),
        }
    }

    fn url(&self, path: &str) -> Result<Url, BmcError> {
        let url = self
            .address
            .base_url
            .join(path)
            .map_err(|e| BmcError::InvalidResponse {
                endpoint: self.endpoint.clone(),
                path: path.to_string(),
                detail: format!("not a usable path: {e}"),
            })?;
        if endpoint_of(&url) != self.endpoint {
            return Err(BmcError::RedirectRefused {
                endpoint: self.endpoint.clone(),
                path: path.to_string(),
                target: endpoint_of(&url),
            });
        }
        Ok(url)
    }

    /// The secrets to keep out of text, with `tokens` (from [`Self::remembered_tokens`]).
    fn secrets<'a>(&'a self, tokens: &'a [Arc<str>]) -> text::Secrets<'a> {
        text::Secrets::new(self.credentials.username(), self.credentials.password())
            .with_tokens(tokens)
    }

    fn remembered_tokens(&self) -> Vec<Arc<str>> {
        match self.tokens.read() {
            Ok(tokens) => tokens.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Remembers a new session token for scrubbing, forgetting the oldest beyond
    /// [`REMEMBERED_TOKENS`].
    fn remember_token(&self, token: &Arc<str>) {
        let mut tokens = match self.tokens.write() {
            Ok(tokens) => tokens,
            Err(poisoned) => poisoned.into_inner(),
        };
        tokens.retain(|t| t != token);
        tokens.push(token.clone());
        let excess = tokens.len().saturating_sub(REMEMBERED_TOKENS);
        tokens.drain(..excess);
    }

    /// Text from the BMC made fit for an error or a log: no password, no session token,
    /// about 1 KiB at most.
    fn bmc_text(&self, bmc_text: &str) -> String {
        let tokens = self.remembered_tokens();
        text::from_bmc_without(bmc_text, &self.secrets(&tokens))
    }

    /// An error fit for a log line or a retry: without the password or a session token (the
    /// driver's callers get errors scrubbed anyway; this is for what is logged on the way).
    fn scrub_error(&self, error: BmcError) -> BmcError {
        let tokens = self.remembered_tokens();
        error.scrubbed_of(&self.secrets(&tokens))
    }

    fn auth_state(&self) -> AuthState {
        match self.auth.read() {
            Ok(state) => state.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_auth_state(&self, new: AuthState) {
        match self.auth.write() {
            Ok(mut state) => *state = new,
            Err(poisoned) => *poisoned.into_inner() = new,
        }
    }

    /// The credentials to put on the next request, logging in first if needed.
    async fn current_auth(&self) -> Result<Auth, BmcError> {
        match self.auth_state() {
            AuthState::Basic => return Ok(Auth::Basic),
            AuthState::Session { token, .. } => return Ok(Auth::Token(token)),
            AuthState::Unresolved => {}
        }
        let _login = self.login_lock.lock().await;
        // Another call may have logged in while this one waited.
        match self.auth_state() {
            AuthState::Basic => Ok(Auth::Basic),
            AuthState::Session { token, .. } => Ok(Auth::Token(token)),
            AuthState::Unresolved => self.login().await,
        }
    }

    /// Forgets an expired session token (unless another call already replaced it).
    fn drop_session(&self, expired: &Arc<str>) {
        if let AuthState::Session { token, .. } = self.auth_state()
            && Arc::ptr_eq(&token, expired)
        {
            self.set_auth_state(AuthState::Unresolved);
        }
    }

    async fn login(&self) -> Result<Auth, BmcError> {
        let sessions_path = self.sessions_path().await;
        let url = self.url(&sessions_path)?;
        let body = serde_json::json!({
            "UserName": self.credentials.username(),
            "Password": self.credentials.password(),
        });
        let reply = self
            .send_following(Method::POST, url, Some(&body), None)
            .await?;
        let auto = self.options.auth == RedfishAuthMode::Auto;
        if reply.status.is_success() {
            let token = reply
                .headers
                .get(X_AUTH_TOKEN)
                .and_then(|v| v.to_str().ok());
            if let Some(token) = token {
                let token: Arc<str> = Arc::from(token);
                // Before anything can quote it.
                self.remember_token(&token);
                let location = self.session_url(&reply);
                tracing::debug!(endpoint = %self.endpoint, "opened a Redfish session");
                self.set_auth_state(AuthState::Session {
                    token: token.clone(),
                    location,
                });
                return Ok(Auth::Token(token));
            }
            if !auto {
                return Err(BmcError::InvalidResponse {
                    endpoint: self.endpoint.clone(),
                    path: sessions_path,
                    detail: "session created without an X-Auth-Token header".into(),
                });
            }
        } else if reply.status.is_server_error() || reply.status == StatusCode::TOO_MANY_REQUESTS {
            // Never the body of a failed login: BMCs have been seen echoing the password.
            let mut error = self.status_error(&Method::POST, &sessions_path, &reply);
            if let BmcError::Http { message, .. } = &mut error {
                message.clear();
            }
            return Err(error);
        } else if !auto {
            return Err(match reply.status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    BmcError::AuthenticationFailed {
                        endpoint: self.endpoint.clone(),
                        detail: format!("session login answered HTTP {}", reply.status.as_u16()),
                    }
                }
                _ => BmcError::Unsupported {
                    driver: self.description().to_string(),
                    operation: "open a Redfish session".into(),
                    reason: format!(
                        "POST {sessions_path} answered HTTP {}; use basic or auto auth",
                        reply.status.as_u16()
                    ),
                },
            });
        }
        tracing::debug!(
            endpoint = %self.endpoint,
            status = reply.status.as_u16(),
            "no Redfish session; using basic auth"
        );
        self.set_auth_state(AuthState::Basic);
        Ok(Auth::Basic)
    }

    /// Sends one request and reads the whole body; maps transport failures to errors.
    async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<&serde_json::Value>,
        auth: Option<&Auth>,
    ) -> Result<Reply, BmcError> {
        let path = url.path().to_string();
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| BmcError::Connection {
                endpoint: self.endpoint.clone(),
                detail: "the connection pool was shut down".into(),
            })?;
        let mut request = self
            .http
            .request(method.clone(), url)
            .header("OData-Version", "4.0");
        request = match auth {
            Some(Auth::Basic) => request.basic_auth(
                self.credentials.username(),
                Some(self.credentials.password()),
            ),
            Some(Auth::Token(token)) => request.header(X_AUTH_TOKEN, token.as_ref()),
            None => request,
        };
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| self.transport_error(&method, &path, e))?;
        let status = response.status();
        let headers = response.headers().clone();
        // Capped: a BMC streaming gigabytes must not exhaust the operator's memory.
        let body = bounded::read_body(response, self.options.max_body_bytes)
            .await
            .map_err(|e| match e {
                BodyError::Transport(e) => self.transport_error(&method, &path, e),
                BodyError::TooLarge(too_large) => BmcError::InvalidResponse {
                    endpoint: self.endpoint.clone(),
                    path: path.clone(),
                    detail: too_large.to_string(),
                },
            })?;
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    fn transport_error(&self, method: &Method, path: &str, error: reqwest::Error) -> BmcError {
        match find_in_chain::<crate::resolve::ResolveError>(&error) {
            Some(crate::resolve::ResolveError::Refused(refused)) => {
                return BmcError::DestinationRefused(refused.clone());
            }
            Some(lookup @ crate::resolve::ResolveError::Lookup { .. }) => {
                return BmcError::Connection {
                    endpoint: self.endpoint.clone(),
                    detail: lookup.to_string(),
                };
            }
            None => {}
        }
        if let Some(redirect) = find_in_chain::<CrossHostRedirect>(&error) {
            return BmcError::RedirectRefused {
                endpoint: self.endpoint.clone(),
                path: path.to_string(),
                target: redirect.target.clone(),
            };
        }
        if let Some(tls) = find_tls_error(&error) {
            return match tls {
                rustls::Error::InvalidCertificate(cert) => BmcError::Certificate {
                    endpoint: self.endpoint.clone(),
                    detail: crate::tls::describe_certificate_error(cert),
                },
                other => BmcError::Connection {
                    endpoint: self.endpoint.clone(),
                    detail: format!("TLS handshake failed: {other}"),
                },
            };
        }
        if error.is_timeout() {
            return BmcError::Timeout {
                what: format!("the answer of BMC {} to {method} {path}", self.endpoint),
                after: self.options.request_timeout,
            };
        }
        if error.is_redirect() {
            return BmcError::InvalidResponse {
                endpoint: self.endpoint.clone(),
                path: path.to_string(),
                detail: error_chain(&error),
            };
        }
        BmcError::Connection {
            endpoint: self.endpoint.clone(),
            detail: error_chain(&error),
        }
    }

    fn status_error(&self, method: &Method, path: &str, reply: &Reply) -> BmcError {
        let endpoint = self.endpoint.clone();
        match reply.status {
            StatusCode::UNAUTHORIZED => BmcError::AuthenticationFailed {
                endpoint,
                detail: format!("HTTP 401 for {method} {path}"),
            },
            StatusCode::FORBIDDEN => BmcError::PermissionDenied {
                endpoint,
                method: method.to_string(),
                path: path.to_string(),
            },
            status => BmcError::Http {
                endpoint,
                method: method.to_string(),
                path: path.to_string(),
                status: status.as_u16(),
                message: {
                    let tokens = self.remembered_tokens();
                    redfish_message(&reply.body, &self.secrets(&tokens))
                },
                retry_after: reply
                    .headers
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| parse_retry_after(v, jiff::Timestamp::now())),
            },
        }
    }

    /// One authenticated exchange, re-logging in once if the session expired.
    async fn exchange_once(
        &self,
        method: &Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Reply, BmcError> {
        let url = self.url(path)?;
        let auth = self.current_auth().await?;
        let mut reply = self
            .send_following(method.clone(), url.clone(), body, Some(&auth))
            .await?;
        if reply.status == StatusCode::UNAUTHORIZED
            && let Auth::Token(expired) = &auth
        {
            tracing::info!(endpoint = %self.endpoint, "Redfish session expired; logging in again");
            self.drop_session(expired);
            let auth = self.current_auth().await?;
            reply = self
                .send_following(method.clone(), url, body, Some(&auth))
                .await?;
        }
        if reply.status.is_success() {
            Ok(reply)
        } else {
            Err(self.status_error(method, path, &reply))
        }
    }

    /// An exchange with retries. Requests that must not be repeated blindly (reboots) are
    /// only retried when they surely did not reach the BMC.
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
        repeatable: bool,
    ) -> Result<Reply, BmcError> {
        // The path may come from the BMC (a member id, an action target): scrubbed and bounded,
        // as is each attempt's error, since the retries log both.
        let operation = self.bmc_text(&format!("{method} {}{path}", self.endpoint));
        with_retries(&self.options.retry, &operation, || async {
            match self.exchange_once(&method, path, body.as_ref()).await {
                Err(BmcError::Timeout { what, after }) if !repeatable => {
                    Err(self.scrub_error(BmcError::OutcomeUnknown { what, after }))
                }
                Err(e) => Err(self.scrub_error(e)),
                ok => ok,
            }
        })
        .await
    }

    fn parse<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &[u8],
    ) -> Result<T, BmcError> {
        serde_json::from_slice(body).map_err(|e| BmcError::InvalidResponse {
            endpoint: self.endpoint.clone(),
            path: path.to_string(),
            // serde's message may quote the BMC's values.
            detail: self.bmc_text(&format!("malformed JSON: {e}")),
        })
    }

    /// The System's path: from the address, or the only member of the Systems collection.
    async fn system_path(&self) -> Result<&str, BmcError> {
        self.system_path
            .get_or_try_init(|| async {
                if let Some(path) = &self.address.system_path {
                    return Ok(path.clone());
                }
                let reply = self.exchange(Method::GET, SYSTEMS_PATH, None, true).await?;
                let collection: Collection = self.parse(SYSTEMS_PATH, &reply.body)?;
                match collection.members.as_slice() {
                    [only] => Ok(only.odata_id.clone()),
                    members => Err(BmcError::SystemAmbiguous {
                        endpoint: self.endpoint.clone(),
                        count: members.len(),
                        members: self.bmc_text(
                            &members
                                .iter()
                                .take(10)
                                .map(|m| m.odata_id.as_str())
                                .collect::<Vec<_>>()
                                .join(", "),
                        ),
                    }),
                }
            })
            .await
            .map(String::as_str)
    }

    async fn get_system(&self) -> Result<(String, SystemResource), BmcError> {
        let path = self.system_path().await?.to_string();
        let reply = match self.exchange(Method::GET, &path, None, true).await {
            Err(BmcError::Http { status: 404, .. }) => {
                return Err(BmcError::SystemNotFound {
                    endpoint: self.endpoint.clone(),
                    path,
                });
            }
            other => other?,
        };
        let system = self.parse(&path, &reply.body)?;
        Ok((path, system))
    }

    async fn reset_info(&self, path: &str, system: &SystemResource) -> Result<ResetInfo, BmcError> {
        let action = system.actions.as_ref().and_then(|a| a.reset.as_ref());
        let target = action
            .and_then(|a| a.target.clone())
            .unwrap_or_else(|| format!("{path}/Actions/ComputerSystem.Reset"));
        let allowed = self.allowed_reset_types(action).await?;
        Ok(ResetInfo { target, allowed })
    }

    async fn post_reset(
        &self,
        target: &str,
        reset_type: &str,
        repeatable: bool,
    ) -> Result<(), BmcError> {
        let body = serde_json::json!({ "ResetType": reset_type });
        match self
            .exchange(Method::POST, target, Some(body), repeatable)
            .await
        {
            Ok(_) => Ok(()),
            Err(BmcError::Http {
                status: 404 | 405 | 501,
                path,
                message,
                ..
            }) => Err(BmcError::Unsupported {
                driver: self.description().to_string(),
                operation: format!("ResetType={reset_type}"),
                reason: format!("the BMC has no reset action at {path}{message}"),
            }),
            Err(e) => Err(e),
        }
    }

    /// Sends `soft` if allowed and accepted, else `hard` at once, recording why.
    async fn reset_soft_or_hard(
        &self,
        request: PowerRequest,
        info: &ResetInfo,
        soft: Option<&str>,
        hard: &str,
        repeatable: bool,
    ) -> Result<PowerOutcome, BmcError> {
        let mut hard_fallback = None;
        if let Some(soft) = soft {
            if info.allows(soft) {
                match self.post_reset(&info.target, soft, repeatable).await {
                    Ok(()) => return Ok(PowerOutcome::sent(request, format!("ResetType={soft}"))),
                    Err(BmcError::Http {
                        status: 400,
                        message,
                        ..
                    }) => {
                        hard_fallback =
                            Some(format!("the BMC rejected {soft} (HTTP 400{message})"));
                    }
                    Err(e) => return Err(e),
                }
            } else {
                // The list is the BMC's: scrubbed before it is logged below.
                hard_fallback = Some(self.bmc_text(&format!(
                    "{soft} is not among the BMC's allowed reset types {}",
                    info.allowed_list()
                )));
            }
        }
        if !info.allows(hard) {
            return Err(BmcError::Unsupported {
                driver: self.description().to_string(),
                operation: request.to_string(),
                reason: format!(
                    "{hard} is not among the allowed reset types {}",
                    info.allowed_list()
                ),
            });
        }
        if let Some(reason) = &hard_fallback {
            tracing::info!(endpoint = %self.endpoint, %reason, "soft request carried out hard");
        }
        self.post_reset(&info.target, hard, repeatable).await?;
        Ok(PowerOutcome {
            request,
            action: Some(format!("ResetType={hard}")),
            hard_fallback,
            output: None,
        })
    }
}

fn parse_power_state(value: Option<&str>) -> PowerState {
    match value {
        Some("On") => PowerState::On,
        Some("Off") => PowerState::Off,
        Some("PoweringOn") | Some("PoweringOff") => PowerState::Transitioning,
        _ => PowerState::Unknown,
    }
}

/// The power calls; [`BmcOperations`] makes them a [`PowerDriver`] bounded by the call
/// deadline.
#[async_trait]
impl BmcOperations for RedfishDriver {
    fn describe(&self) -> DriverDescription {
        let mut detail = match &self.address.system_path {
            Some(path) => format!("system {path}"),
            None => "the only system in /redfish/v1/Systems".to_string(),
        };
        if self.address.flavor != RedfishFlavor::Redfish {
            detail = format!("{}, {detail}", self.address.flavor.scheme());
        }
        DriverDescription {
            kind: DriverKind::Redfish,
            endpoint: self.endpoint.clone(),
            detail,
        }
    }

    fn call_deadline(&self) -> Duration {
        self.options.retry.deadline
    }

    fn credentials(&self) -> Option<&BmcCredentials> {
        Some(&self.credentials)
    }

    fn session_tokens(&self) -> Vec<Arc<str>> {
        self.remembered_tokens()
    }

    async fn end_session(&self) -> Result<(), BmcError> {
        self.logout().await
    }

    async fn read_power_state(&self) -> Result<PowerState, BmcError> {
        let (_, system) = self.get_system().await?;
        Ok(parse_power_state(system.power_state.as_deref()))
    }

    async fn read_power_reading(&self) -> Result<PowerReading, BmcError> {
        let (_, system) = self.get_system().await?;
        Ok(PowerReading {
            state: parse_power_state(system.power_state.as_deref()),
            identity: system.identity(),
        })
    }

    async fn request_power_on(&self) -> Result<PowerOutcome, BmcError> {
        let request = PowerRequest::On;
        let (path, system) = self.get_system().await?;
        if parse_power_state(system.power_state.as_deref()) == PowerState::On {
            return Ok(PowerOutcome::already_done(request));
        }
        let info = self.reset_info(&path, &system).await?;
        let Some(reset_type) = info.first_allowed(&["On", "ForceOn"]) else {
            return Err(BmcError::Unsupported {
                driver: self.description().to_string(),
                operation: request.to_string(),
                reason: format!("neither On nor ForceOn is allowed: {}", info.allowed_list()),
            });
        };
        self.post_reset(&info.target, reset_type, true).await?;
        Ok(PowerOutcome::sent(
            request,
            format!("ResetType={reset_type}"),
        ))
    }

    async fn request_power_off(&self, mode: PowerOffMode) -> Result<PowerOutcome, BmcError> {
        let request = PowerRequest::Off(mode);
        let (path, system) = self.get_system().await?;
        if parse_power_state(system.power_state.as_deref()) == PowerState::Off {
            return Ok(PowerOutcome::already_done(request));
        }
        let info = self.reset_info(&path, &system).await?;
        let soft = (mode == PowerOffMode::Soft).then_some("GracefulShutdown");
        self.reset_soft_or_hard(request, &info, soft, "ForceOff", true)
            .await
    }

    async fn request_reboot(&self, mode: PowerOffMode) -> Result<PowerOutcome, BmcError> {
        let request = PowerRequest::Reboot(mode);
        let (path, system) = self.get_system().await?;
        let info = self.reset_info(&path, &system).await?;
        if parse_power_state(system.power_state.as_deref()) == PowerState::Off {
            // Restarting a host that is off means starting it.
            let reset_type = info.first_allowed(&["On", "ForceOn"]).unwrap_or("On");
            self.post_reset(&info.target, reset_type, true).await?;
            return Ok(PowerOutcome::sent(
                request,
                format!("ResetType={reset_type} (host was off)"),
            ));
        }
        let soft = (mode == PowerOffMode::Soft).then_some("GracefulRestart");
        self.reset_soft_or_hard(request, &info, soft, "ForceRestart", false)
            .await
    }
}

impl Drop for RedfishDriver {
    /// Closes the session, best effort: BMCs have few session slots.
    fn drop(&mut self) {
        let AuthState::Session {
            token,
            location: Some(location),
        } = self.auth_state()
        else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let request = self
            .http
            .delete(location)
            .header(X_AUTH_TOKEN, token.as_ref());
        runtime.spawn(async move {
            let _ = request.send().await;
        });
    }
}

/// `": message (extended; info)"` from a Redfish error body, or a cleaned-up text excerpt;
/// without the password or a session token (scrubbed before the text is cut, so no part of
/// them is left).
fn redfish_message(body: &[u8], secrets: &text::Secrets<'_>) -> String {
    #[derive(Deserialize)]
    struct ErrorBody {
        error: ErrorDetail,
    }
    #[derive(Deserialize)]
    struct ErrorDetail {
        message: Option<String>,
        #[serde(rename = "@Message.ExtendedInfo", default)]
        extended: Vec<ExtendedInfo>,
    }
    #[derive(Deserialize)]
    struct ExtendedInfo {
        #[serde(rename = "Message")]
        message: Option<String>,
    }
    let text = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(parsed) => {
            let mut parts: Vec<String> = parsed.error.message.into_iter().collect();
            parts.extend(parsed.error.extended.into_iter().filter_map(|e| e.message));
            parts.dedup();
            parts.join("; ")
        }
        // Scrubbed before the whitespace is squeezed: the password may contain some.
        Err(_) => text::scrub(&String::from_utf8_lossy(body), secrets)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
    };
    if text.is_empty() {
        return String::new();
    }
    let text = text::scrub(&text, secrets);
    format!(": {}", text::clip_to(&text, MAX_MESSAGE_BYTES))
}

/// Every message in an error's source chain, joined, without repeats.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut current = Some(error);
    while let Some(err) = current {
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        current = err.source();
    }
    parts.join(": ")
}

fn find_in_chain<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut current = Some(error);
    while let Some(err) = current {
        if let Some(found) = err.downcast_ref::<T>() {
            return Some(found);
        }
        current = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn power_states() {
        assert_eq!(parse_power_state(Some("On")), PowerState::On);
        assert_eq!(parse_power_state(Some("Off")), PowerState::Off);
        assert_eq!(
            parse_power_state(Some("PoweringOff")),
            PowerState::Transitioning
        );
        assert_eq!(parse_power_state(Some("Paused")), PowerState::Unknown);
        assert_eq!(parse_power_state(None), PowerState::Unknown);
    }

    #[test]
    fn error_messages_from_redfish_bodies() {
        let body = br#"{"error":{"code":"Base.1.0.GeneralError","message":"nope",
            "@Message.ExtendedInfo":[{"Message":"ResetType not supported"}]}}"#;
        let credentials = BmcCredentials::new("admin", "Sekr1t-xyzzy").unwrap();
        let secrets = text::Secrets::new(credentials.username(), credentials.password());
        let message = |body: &[u8]| redfish_message(body, &secrets);
        assert_eq!(message(body), ": nope; ResetType not supported");
        assert_eq!(
            message(b"<html>\n  <b>Bad</b> </html>"),
            ": <html> <b>Bad</b> </html>"
        );
        assert_eq!(message(b""), "");
        let long = "x".repeat(1000);
        assert!(message(long.as_bytes()).chars().count() < 310);
    }

    #[test]
    fn error_messages_never_carry_the_password() {
        let credentials = BmcCredentials::new("admin", "Sekr1t xyzzy").unwrap();
        // Near the cut, JSON-escaped in a JSON message, or in plain text with odd spacing.
        let near_the_cut = format!("{}Sekr1t xyzzy{}", "y".repeat(280), "y".repeat(100));
        let escaped = br#"{"error":{"message":"bad password Sekr1t xyzzy"}}"#;
        for body in [
            near_the_cut.as_bytes(),
            escaped.as_slice(),
            b"<p>login failed for Sekr1t xyzzy</p>\n\n",
        ] {
            let secrets = text::Secrets::new(credentials.username(), credentials.password());
            let message = redfish_message(body, &secrets);
            assert!(!message.contains("Sekr"), "{message}");
        }
    }

    #[test]
    fn reset_info_choices() {
        let info = ResetInfo {
            target: "/t".into(),
            allowed: Some(vec!["ForceOn".into()]),
        };
        assert_eq!(info.first_allowed(&["On", "ForceOn"]), Some("ForceOn"));
        assert!(!info.allows("GracefulShutdown"));
        let open = ResetInfo {
            target: "/t".into(),
            allowed: None,
        };
        assert_eq!(open.first_allowed(&["On", "ForceOn"]), Some("On"));
    }
}
