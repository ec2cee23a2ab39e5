//! A Redfish BMC that behaves like a real vendor's: it serves the payloads one real BMC model
//! served (`fixtures/redfish-mockups/<folder>/redfish/v1/...`) with that vendor's documented
//! behaviour from `vendor.json` — session login at the path the service root names, the
//! vendor's `Location` form and answer codes, basic auth where allowed, trailing-slash
//! acceptance or redirects, case-insensitive paths, reset answers (200, 204, 202 with a task
//! monitor), refusals of reset types or of resets in the wrong power state, power changes that
//! take time (with `PoweringOn`/`PoweringOff` where the vendor shows them), several Systems.
//!
//! It records every request and every session, so tests can assert what a client did (where
//! it logged in, whether it logged out, which reset types it sent).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::TestkitError;

/// The folder holding one sub-folder per BMC model (copied from `../shared/redfish-mockups`).
pub fn mockups_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/redfish-mockups")
}

/// Every BMC model in [`mockups_dir`], sorted: the folders holding a `vendor.json`.
pub fn vendor_folders() -> Result<Vec<String>, TestkitError> {
    let dir = mockups_dir();
    let entries = std::fs::read_dir(&dir).map_err(|source| TestkitError::Io {
        what: format!("listing {}", dir.display()),
        source,
    })?;
    let mut folders = Vec::new();
    for entry in entries.flatten() {
        if entry.path().join("vendor.json").is_file() {
            folders.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    folders.sort();
    Ok(folders)
}

/// `vendor.json`: a vendor's documented behaviour.
#[derive(Clone, Debug, Deserialize)]
pub struct VendorProfile {
    pub name: String,
    pub credentials: VendorCredentials,
    /// `redfish+http`, `idrac-redfish+http`, `ilo5-redfish+http`...
    pub address_scheme: String,
    /// The System path metal3 users put in the address; `None`: the address leaves it out.
    pub address_path: Option<String>,
    /// `On` or `Off`.
    pub initial_power_state: String,
    #[serde(default)]
    pub paths: PathRules,
    #[serde(default)]
    pub auth: AuthRules,
    pub sessions: SessionRules,
    pub reset: ResetRules,
}

#[derive(Clone, Debug, Deserialize)]
pub struct VendorCredentials {
    pub username: String,
    pub password: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct PathRules {
    /// `accept` (with or without), or `redirect` (every path without one is redirected).
    #[serde(default)]
    pub trailing_slash: Option<String>,
    #[serde(default)]
    pub redirect_status: Option<u16>,
    #[serde(default)]
    pub case_insensitive: bool,
}

#[derive(Clone, Debug, Deserialize)]
pub struct AuthRules {
    /// HTTP basic auth accepted (DSP0266 requires it; vendors may turn it off).
    #[serde(default = "yes")]
    pub basic: bool,
    /// The body of a 401.
    #[serde(default)]
    pub unauthorized_body: Option<Value>,
}

impl Default for AuthRules {
    fn default() -> Self {
        AuthRules {
            basic: true,
            unauthorized_body: None,
        }
    }
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Deserialize)]
pub struct SessionRules {
    pub enabled: bool,
    pub path: String,
    pub create_status: u16,
    /// `relative` or `absolute`.
    pub location: String,
    #[serde(default)]
    pub location_trailing_slash: bool,
    /// `administrator{hex}`; a counter when absent.
    #[serde(default)]
    pub id_format: Option<String>,
    /// `"session"` (a Session resource), a template (`{id}` replaced) or `null`.
    #[serde(default)]
    pub create_body: Value,
    pub delete_status: u16,
    #[serde(default)]
    pub delete_body: Value,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ResetRules {
    /// Reset types the BMC really accepts, when it differs from what it advertises.
    #[serde(default)]
    pub accepted: Option<Vec<String>>,
    pub success: ResetSuccess,
    /// The answer to a reset type the BMC does not accept (`{value}` replaced).
    #[serde(default)]
    pub not_allowed: Option<StatusBody>,
    #[serde(default)]
    pub state_errors: Vec<StateError>,
    pub delays: Delays,
    #[serde(default)]
    pub transitional_states: bool,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ResetSuccess {
    pub status: u16,
    #[serde(default)]
    pub body: Option<Value>,
    /// 202 with a task monitor in `Location`.
    #[serde(default)]
    pub task: bool,
    #[serde(default)]
    pub retry_after: Option<u64>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct StatusBody {
    pub status: u16,
    #[serde(default)]
    pub body: Option<Value>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct StateError {
    pub reset_types: Vec<String>,
    /// Power states (`On`, `Off`) in which these reset types are refused.
    pub when: Vec<String>,
    pub status: u16,
    #[serde(default)]
    pub body: Option<Value>,
}

/// Seconds each kind of power change takes.
#[derive(Clone, Debug, Deserialize)]
pub struct Delays {
    pub force: f64,
    pub graceful: f64,
    pub on: f64,
}

/// Every ResetType value DSP0266's ResetType enumeration defines.
pub const KNOWN_RESET_TYPES: &[&str] = &[
    "On",
    "ForceOff",
    "GracefulShutdown",
    "GracefulRestart",
    "ForceRestart",
    "Nmi",
    "ForceOn",
    "PushPowerButton",
    "PowerCycle",
    "Suspend",
    "Pause",
    "Resume",
    "FullPowerCycle",
];

/// How the server deviates from `vendor.json`, for tests.
#[derive(Clone, Debug)]
pub struct VendorServerOptions {
    /// Multiplies every delay of `vendor.json` (0.05: a 2 s shutdown takes 100 ms).
    pub time_scale: f64,
    /// The OS ignores graceful requests (they are accepted, nothing happens).
    pub graceful_never_completes: bool,
    /// Serve sessions at this path instead (and name it in the service root's Links.Sessions).
    pub sessions_path: Option<String>,
    /// Logins succeed but their tokens are never accepted (a BMC that lost its session store).
    pub tokens_rejected: bool,
    /// The reset types the BMC really accepts, instead of `vendor.json`'s or the payload's.
    pub accepted: Option<Vec<String>>,
}

impl Default for VendorServerOptions {
    fn default() -> Self {
        VendorServerOptions {
            time_scale: 1.0,
            graceful_never_completes: false,
            sessions_path: None,
            tokens_rejected: false,
            accepted: None,
        }
    }
}

/// How a request authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestAuth {
    None,
    /// Basic auth with the right credentials.
    Basic,
    /// Basic auth with other credentials.
    BadBasic,
    /// A token of an open session (its id).
    Session(String),
    /// A token the BMC does not know (never issued, expired or deleted).
    UnknownToken,
}

/// One request as the server received it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub method: String,
    /// The path as sent (before any case or slash normalisation).
    pub path: String,
    pub auth: RequestAuth,
    pub body: Option<Value>,
    /// What the server answered.
    pub status: u16,
}

/// One session as the server saw it.
#[derive(Clone, Debug)]
pub struct SessionRecord {
    pub id: String,
    pub token: String,
    /// Deleted by the client.
    pub deleted: bool,
    /// Expired by the server ([`VendorServer::expire_sessions`]).
    pub expired: bool,
}

impl SessionRecord {
    pub fn is_open(&self) -> bool {
        !self.deleted && !self.expired
    }
}

/// One reset request and the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResetRecord {
    /// The System's path (as in the payload).
    pub system: String,
    pub reset_type: String,
    pub status: u16,
}

struct Power {
    on: bool,
    /// Changes still to happen: at this time the power becomes this.
    schedule: VecDeque<(Instant, bool)>,
}

impl Power {
    fn settle(&mut self, now: Instant) {
        while let Some(&(at, on)) = self.schedule.front() {
            if at > now {
                break;
            }
            self.on = on;
            self.schedule.pop_front();
        }
    }

    /// What the power will be once every scheduled change happened.
    fn target(&self) -> bool {
        self.schedule.back().map_or(self.on, |&(_, on)| on)
    }

    fn shown(&mut self, now: Instant, transitional: bool) -> &'static str {
        self.settle(now);
        match self.schedule.front() {
            Some(&(_, next)) if transitional && next != self.on => {
                if next {
                    "PoweringOn"
                } else {
                    "PoweringOff"
                }
            }
            _ if self.on => "On",
            _ => "Off",
        }
    }
}

struct Task {
    /// When the power change the task stands for is done.
    done_at: Instant,
    reset_type: String,
}

#[derive(Default)]
struct Log {
    requests: Vec<RecordedRequest>,
    sessions: Vec<SessionRecord>,
    resets: Vec<ResetRecord>,
}

struct Shared {
    folder: String,
    profile: VendorProfile,
    options: VendorServerOptions,
    /// Payloads by normalised path.
    resources: HashMap<String, Value>,
    /// System payload path (normalised) → its power.
    power: Mutex<HashMap<String, Power>>,
    /// Reset target (normalised) → System path (normalised).
    reset_targets: HashMap<String, String>,
    tasks: Mutex<HashMap<u64, Task>>,
    log: Mutex<Log>,
    counter: AtomicU64,
}

/// A vendor's BMC on a loopback port.
pub struct VendorServer {
    shared: Arc<Shared>,
    port: u16,
    stop: CancellationToken,
}

impl Drop for VendorServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

fn other(what: impl Into<String>, message: impl std::fmt::Display) -> TestkitError {
    TestkitError::Other {
        what: what.into(),
        message: message.to_string(),
    }
}

/// Reads every `redfish/v1/**/index.json` under `dir`, keyed by the path it is served at.
fn load_resources(dir: &Path) -> Result<BTreeMap<String, Value>, TestkitError> {
    fn walk(
        base: &Path,
        dir: &Path,
        out: &mut BTreeMap<String, Value>,
    ) -> Result<(), TestkitError> {
        let entries = std::fs::read_dir(dir).map_err(|source| TestkitError::Io {
            what: format!("listing {}", dir.display()),
            source,
        })?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(base, &path, out)?;
            } else if path.file_name().is_some_and(|n| n == "index.json") {
                let text = std::fs::read_to_string(&path).map_err(|source| TestkitError::Io {
                    what: format!("reading {}", path.display()),
                    source,
                })?;
                let value: Value = serde_json::from_str(&text)
                    .map_err(|e| other(format!("parsing {}", path.display()), e))?;
                let parent = path.parent().unwrap_or(base);
                let relative = parent.strip_prefix(base).unwrap_or(parent);
                let served = format!("/{}", relative.to_string_lossy());
                out.insert(served, value);
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    walk(dir, &dir.join("redfish"), &mut out)?;
    Ok(out)
}

impl VendorServer {
    /// Serves `folder` (one of [`vendor_folders`]) on a free loopback port.
    pub async fn start(
        folder: &str,
        options: VendorServerOptions,
    ) -> Result<VendorServer, TestkitError> {
        let dir = mockups_dir().join(folder);
        let vendor_path = dir.join("vendor.json");
        let text = std::fs::read_to_string(&vendor_path).map_err(|source| TestkitError::Io {
            what: format!("reading {}", vendor_path.display()),
            source,
        })?;
        let profile: VendorProfile = serde_json::from_str(&text)
            .map_err(|e| other(format!("parsing {}", vendor_path.display()), e))?;
        let case_insensitive = profile.paths.case_insensitive;
        let norm = |p: &str| normalize(p, case_insensitive);

        let mut resources = HashMap::new();
        let mut power = HashMap::new();
        let mut reset_targets = HashMap::new();
        let initially_on = profile.initial_power_state == "On";
        for (path, mut value) in load_resources(&dir)? {
            let key = norm(&path);
            if is_system_path(&key) && value.get("PowerState").is_some() {
                power.insert(
                    key.clone(),
                    Power {
                        on: initially_on,
                        schedule: VecDeque::new(),
                    },
                );
                let target = value
                    .pointer("/Actions/#ComputerSystem.Reset/target")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{path}/Actions/ComputerSystem.Reset"));
                reset_targets.insert(norm(&target), key.clone());
            }
            if key == norm("/redfish/v1")
                && let Some(sessions) = &options.sessions_path
            {
                value["Links"]["Sessions"] = json!({ "@odata.id": sessions });
            }
            resources.insert(key, value);
        }
        let shared = Arc::new(Shared {
            folder: folder.to_string(),
            profile,
            options,
            resources,
            power: Mutex::new(power),
            reset_targets,
            tasks: Mutex::default(),
            log: Mutex::default(),
            counter: AtomicU64::new(0),
        });

        let (listener, port) =
            crate::process::bind_loopback(&format!("the {folder} Redfish mockup")).await?;
        let stop = CancellationToken::new();
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let stopped = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await })
                .await;
        });
        Ok(VendorServer { shared, port, stop })
    }

    pub fn folder(&self) -> &str {
        &self.shared.folder
    }

    pub fn profile(&self) -> &VendorProfile {
        &self.shared.profile
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The address a metal3 user would write for this BMC: the vendor's scheme and, unless the
    /// vendor's address leaves it out, the System path.
    pub fn address(&self) -> String {
        let path = self.shared.profile.address_path.as_deref().unwrap_or("");
        self.address_with_path(path)
    }

    /// The vendor's scheme without a System path (the driver has to discover it).
    pub fn address_without_system(&self) -> String {
        self.address_with_path("")
    }

    pub fn address_with_path(&self, path: &str) -> String {
        format!(
            "{}://127.0.0.1:{}{path}",
            self.shared.profile.address_scheme, self.port
        )
    }

    /// The Systems' paths, as their payloads name them (`@odata.id`), sorted.
    pub fn system_paths(&self) -> Vec<String> {
        let power = lock(&self.shared.power);
        let mut paths: Vec<String> = power
            .keys()
            .map(|key| {
                self.shared
                    .resources
                    .get(key)
                    .and_then(|v| v.get("@odata.id"))
                    .and_then(Value::as_str)
                    .unwrap_or(key)
                    .to_string()
            })
            .collect();
        paths.sort();
        paths
    }

    /// The power state the server shows for a System (`On`, `Off`, `PoweringOn`...).
    pub fn power_state(&self, system: &str) -> Option<String> {
        let key = normalize(system, self.shared.profile.paths.case_insensitive);
        let transitional = self.shared.profile.reset.transitional_states;
        lock(&self.shared.power)
            .get_mut(&key)
            .map(|p| p.shown(Instant::now(), transitional).to_string())
    }

    /// Sets a System's power at once (no transition).
    pub fn set_power(&self, system: &str, on: bool) {
        let key = normalize(system, self.shared.profile.paths.case_insensitive);
        if let Some(p) = lock(&self.shared.power).get_mut(&key) {
            p.on = on;
            p.schedule.clear();
        }
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.log).requests.clone()
    }

    /// Every session ever created, oldest first.
    pub fn sessions(&self) -> Vec<SessionRecord> {
        lock(&self.shared.log).sessions.clone()
    }

    /// Sessions neither deleted by the client nor expired by the server.
    pub fn open_sessions(&self) -> usize {
        self.sessions().iter().filter(|s| s.is_open()).count()
    }

    /// Session logins that succeeded.
    pub fn logins(&self) -> usize {
        self.sessions().len()
    }

    /// Every reset request so far, oldest first.
    pub fn resets(&self) -> Vec<ResetRecord> {
        lock(&self.shared.log).resets.clone()
    }

    /// Forgets every open session, as a BMC does when they time out: their tokens get 401.
    pub fn expire_sessions(&self) {
        for s in &mut lock(&self.shared.log).sessions {
            if !s.deleted {
                s.expired = true;
            }
        }
    }

    /// Forgets the recorded requests (sessions and power stay).
    pub fn clear_requests(&self) {
        let mut log = lock(&self.shared.log);
        log.requests.clear();
        log.resets.clear();
    }
}

/// The key a path is looked up by: no trailing slash, lower case where the vendor ignores case.
fn normalize(path: &str, case_insensitive: bool) -> String {
    let trimmed = path.trim_end_matches('/');
    let trimmed = if trimmed.is_empty() { "/" } else { trimmed };
    if case_insensitive {
        trimmed.to_ascii_lowercase()
    } else {
        trimmed.to_string()
    }
}

fn is_system_path(key: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    lower
        .strip_prefix("/redfish/v1/systems/")
        .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'))
}

fn json_response(status: u16, body: Option<&Value>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match body {
        Some(body) if !body.is_null() => (status, axum::Json(body.clone())).into_response(),
        _ => status.into_response(),
    }
}

/// Replaces `{placeholder}` in every string of a JSON template.
fn fill(template: &Value, placeholder: &str, with: &str) -> Value {
    match template {
        Value::String(s) => Value::String(s.replace(placeholder, with)),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| fill(v, placeholder, with)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), fill(v, placeholder, with)))
                .collect(),
        ),
        other => other.clone(),
    }
}

impl Shared {
    fn norm(&self, path: &str) -> String {
        normalize(path, self.profile.paths.case_insensitive)
    }

    fn scaled(&self, seconds: f64) -> Duration {
        Duration::from_secs_f64((seconds * self.options.time_scale).max(0.0))
    }

    fn sessions_path(&self) -> &str {
        self.options
            .sessions_path
            .as_deref()
            .unwrap_or(&self.profile.sessions.path)
    }

    fn authenticate(&self, headers: &HeaderMap) -> RequestAuth {
        if let Some(token) = headers.get("x-auth-token").and_then(|v| v.to_str().ok()) {
            let log = lock(&self.log);
            return match log
                .sessions
                .iter()
                .find(|s| s.token == token && s.is_open() && !self.options.tokens_rejected)
            {
                Some(s) => RequestAuth::Session(s.id.clone()),
                None => RequestAuth::UnknownToken,
            };
        }
        let Some(basic) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Basic "))
        else {
            return RequestAuth::None;
        };
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(basic.trim())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        let expected = format!(
            "{}:{}",
            self.profile.credentials.username, self.profile.credentials.password
        );
        if decoded == expected {
            RequestAuth::Basic
        } else {
            RequestAuth::BadBasic
        }
    }

    fn authorized(&self, auth: &RequestAuth) -> bool {
        match auth {
            RequestAuth::Session(_) => true,
            RequestAuth::Basic => self.profile.auth.basic,
            _ => false,
        }
    }

    fn unauthorized(&self) -> Response {
        let body = self
            .profile
            .auth
            .unauthorized_body
            .clone()
            .unwrap_or_else(|| {
                json!({"error": {"code": "Base.1.8.NoValidSession",
                "message": "There is no valid session established with the implementation."}})
            });
        json_response(401, Some(&body))
    }

    fn next_id(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn create_session(&self, headers: &HeaderMap, body: Option<&Value>) -> Response {
        let rules = &self.profile.sessions;
        if !rules.enabled {
            return json_response(405, None);
        }
        let user = body.and_then(|b| b.get("UserName")).and_then(Value::as_str);
        let password = body.and_then(|b| b.get("Password")).and_then(Value::as_str);
        if user != Some(self.profile.credentials.username.as_str())
            || password != Some(self.profile.credentials.password.as_str())
        {
            return self.unauthorized();
        }
        let n = self.next_id();
        let id = match &rules.id_format {
            Some(format) => format.replace(
                "{hex}",
                &format!("{:016x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            ),
            None => n.to_string(),
        };
        let token = format!(
            "{:032x}",
            u128::from(n).wrapping_mul(0x2545_f491_4f6c_dd1d_9e37_79b9)
        );
        let collection = self.sessions_path().trim_end_matches('/').to_string();
        let mut location = format!("{collection}/{id}");
        if rules.location_trailing_slash {
            location.push('/');
        }
        if rules.location == "absolute" {
            let host = headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("127.0.0.1");
            location = format!("http://{host}{location}");
        }
        let body = match &rules.create_body {
            Value::String(s) if s == "session" => Some(json!({
                "@odata.id": format!("{collection}/{id}"),
                "@odata.type": "#Session.v1_0_0.Session",
                "Id": id,
                "Name": "User Session",
                "UserName": self.profile.credentials.username,
            })),
            Value::Null => None,
            template => Some(fill(template, "{id}", &id)),
        };
        lock(&self.log).sessions.push(SessionRecord {
            id,
            token: token.clone(),
            deleted: false,
            expired: false,
        });
        let mut response = json_response(rules.create_status, body.as_ref());
        let headers = response.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&token) {
            headers.insert("x-auth-token", v);
        }
        if let Ok(v) = HeaderValue::from_str(&location) {
            headers.insert(header::LOCATION, v);
        }
        response
    }

    fn delete_session(&self, key: &str) -> Response {
        let collection = self.norm(self.sessions_path());
        let Some(id) = key
            .strip_prefix(&collection)
            .and_then(|rest| rest.strip_prefix('/'))
        else {
            return json_response(405, None);
        };
        let case_insensitive = self.profile.paths.case_insensitive;
        let mut log = lock(&self.log);
        let Some(session) = log.sessions.iter_mut().find(|s| {
            s.is_open() && (s.id == id || (case_insensitive && s.id.eq_ignore_ascii_case(id)))
        }) else {
            return json_response(404, None);
        };
        session.deleted = true;
        drop(log);
        let rules = &self.profile.sessions;
        json_response(rules.delete_status, Some(&rules.delete_body))
    }

    /// The reset types the System accepts.
    fn accepted(&self, system: &str) -> Option<Vec<String>> {
        if let Some(accepted) = &self.options.accepted {
            return Some(accepted.clone());
        }
        if let Some(accepted) = &self.profile.reset.accepted {
            return Some(accepted.clone());
        }
        let payload = self.resources.get(system)?;
        let action = payload.pointer("/Actions/#ComputerSystem.Reset")?;
        let inline: Option<Vec<String>> = action
            .get("ResetType@Redfish.AllowableValues")
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        if let Some(inline) = inline {
            return Some(inline);
        }
        let info_path = action.get("@Redfish.ActionInfo").and_then(Value::as_str)?;
        let info = self.resources.get(&self.norm(info_path))?;
        info.get("Parameters")?
            .as_array()?
            .iter()
            .find(|p| p.get("Name").and_then(Value::as_str) == Some("ResetType"))
            .and_then(|p| p.get("AllowableValues"))
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    fn reset(&self, system: &str, body: Option<&Value>) -> Response {
        let rules = &self.profile.reset;
        let reset_type = body
            .and_then(|b| b.get("ResetType"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let system_id = self
            .resources
            .get(system)
            .and_then(|v| v.get("@odata.id"))
            .and_then(Value::as_str)
            .unwrap_or(system)
            .to_string();
        let record = |status: u16| {
            lock(&self.log).resets.push(ResetRecord {
                system: system_id.clone(),
                reset_type: reset_type.clone(),
                status,
            });
        };
        let accepted = self
            .accepted(system)
            .is_none_or(|list| list.contains(&reset_type));
        if !accepted {
            let (status, body) = match &rules.not_allowed {
                Some(answer) => (
                    answer.status,
                    answer
                        .body
                        .as_ref()
                        .map(|b| fill(b, "{value}", &reset_type)),
                ),
                None => (
                    400,
                    Some(
                        json!({"error": {"code": "Base.1.8.ActionParameterNotSupported",
                        "message": format!("The parameter ResetType={reset_type} is not supported by the action Reset.")}}),
                    ),
                ),
            };
            record(status);
            return json_response(status, body.as_ref());
        }
        let now = Instant::now();
        let mut power = lock(&self.power);
        let Some(p) = power.get_mut(system) else {
            return json_response(404, None);
        };
        p.settle(now);
        let state = if p.target() { "On" } else { "Off" };
        if let Some(refusal) = rules
            .state_errors
            .iter()
            .find(|e| e.reset_types.contains(&reset_type) && e.when.iter().any(|w| w == state))
        {
            drop(power);
            record(refusal.status);
            return json_response(refusal.status, refusal.body.as_ref());
        }
        let force = self.scaled(rules.delays.force);
        let graceful = self.scaled(rules.delays.graceful);
        let on = self.scaled(rules.delays.on);
        let never = self.options.graceful_never_completes;
        let graceful_type = match reset_type.as_str() {
            "PushPowerButton" if p.target() => "GracefulShutdown",
            "PushPowerButton" => "On",
            other => other,
        };
        match graceful_type {
            "On" | "ForceOn" if !p.target() => {
                p.schedule.push_back((now + on, true));
            }
            "ForceOff" | "Off" => {
                p.schedule.clear();
                p.schedule.push_back((now + force, false));
            }
            "GracefulShutdown" if !never && p.target() => {
                p.schedule.push_back((now + graceful, false));
            }
            "ForceRestart" | "PowerCycle" | "FullPowerCycle" => {
                p.schedule.clear();
                p.schedule.push_back((now + force, false));
                p.schedule.push_back((now + force + on, true));
            }
            "GracefulRestart" if !never => {
                p.schedule.push_back((now + graceful, false));
                p.schedule.push_back((now + graceful + on, true));
            }
            _ => {}
        }
        let done_at = p.schedule.back().map_or(now, |&(at, _)| at);
        drop(power);
        record(rules.success.status);
        if rules.success.task {
            let n = self.next_id();
            lock(&self.tasks).insert(
                n,
                Task {
                    done_at,
                    reset_type: reset_type.clone(),
                },
            );
            let body = task_body(n, &reset_type, false);
            let mut response = json_response(rules.success.status, Some(&body));
            let headers = response.headers_mut();
            if let Ok(v) =
                HeaderValue::from_str(&format!("/redfish/v1/TaskService/TaskMonitors/{n}"))
            {
                headers.insert(header::LOCATION, v);
            }
            if let Some(seconds) = rules.success.retry_after {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            return response;
        }
        json_response(rules.success.status, rules.success.body.as_ref())
    }

    fn task_monitor(&self, key: &str) -> Option<Response> {
        let n: u64 = key
            .strip_prefix(&self.norm("/redfish/v1/TaskService/TaskMonitors"))?
            .strip_prefix('/')?
            .parse()
            .ok()?;
        let tasks = lock(&self.tasks);
        let task = tasks.get(&n)?;
        let done = Instant::now() >= task.done_at;
        let body = task_body(n, &task.reset_type, done);
        Some(json_response(if done { 200 } else { 202 }, Some(&body)))
    }

    fn system_payload(&self, key: &str) -> Option<Value> {
        let mut value = self.resources.get(key)?.clone();
        if let Some(p) = lock(&self.power).get_mut(key) {
            value["PowerState"] =
                json!(p.shown(Instant::now(), self.profile.reset.transitional_states));
        }
        Some(value)
    }
}

fn task_body(n: u64, reset_type: &str, done: bool) -> Value {
    json!({
        "@odata.id": format!("/redfish/v1/TaskService/Tasks/{n}"),
        "@odata.type": "#Task.v1_4_3.Task",
        "Id": n.to_string(),
        "Name": format!("ComputerSystem.Reset {reset_type}"),
        "TaskState": if done { "Completed" } else { "Running" },
        "TaskStatus": "OK",
    })
}

async fn handle(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let json_body: Option<Value> = serde_json::from_slice(&body).ok();
    let auth = shared.authenticate(&headers);
    let response = answer(&shared, &method, &path, &headers, json_body.as_ref(), &auth);
    lock(&shared.log).requests.push(RecordedRequest {
        method: method.to_string(),
        path,
        auth,
        body: json_body,
        status: response.status().as_u16(),
    });
    response
}

fn answer(
    shared: &Shared,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: Option<&Value>,
    auth: &RequestAuth,
) -> Response {
    let paths = &shared.profile.paths;
    if paths.trailing_slash.as_deref() == Some("redirect") && !path.ends_with('/') {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("127.0.0.1");
        let mut response = json_response(paths.redirect_status.unwrap_or(301), None);
        if let Ok(v) = HeaderValue::from_str(&format!("http://{host}{path}/")) {
            response.headers_mut().insert(header::LOCATION, v);
        }
        return response;
    }
    let key = shared.norm(path);
    let root = shared.norm("/redfish/v1");
    let sessions = shared.norm(shared.sessions_path());
    // DSP0266: the service root (and /redfish) needs no authentication; neither does a login.
    if *method == Method::GET && (key == root || key == "/redfish") {
        return match shared.resources.get(&key) {
            Some(value) => json_response(200, Some(value)),
            None if key == "/redfish" => json_response(200, Some(&json!({"v1": "/redfish/v1/"}))),
            None => json_response(404, None),
        };
    }
    if *method == Method::POST && key == sessions {
        return shared.create_session(headers, body);
    }
    if !shared.authorized(auth) {
        return shared.unauthorized();
    }
    if *method == Method::DELETE {
        return shared.delete_session(&key);
    }
    if *method == Method::POST {
        return match shared.reset_targets.get(&key) {
            Some(system) => shared.reset(system, body),
            None if shared.resources.contains_key(&key) => json_response(405, None),
            None => json_response(404, None),
        };
    }
    if *method != Method::GET {
        return json_response(405, None);
    }
    if let Some(response) = shared.task_monitor(&key) {
        return response;
    }
    match shared.system_payload(&key) {
        Some(value) => json_response(200, Some(&value)),
        None => json_response(404, None),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_folder_has_a_valid_vendor_json_and_a_system() {
        let folders = vendor_folders().unwrap();
        assert!(folders.len() >= 11, "{folders:?}");
        for folder in folders {
            let dir = mockups_dir().join(&folder);
            let profile: VendorProfile =
                serde_json::from_str(&std::fs::read_to_string(dir.join("vendor.json")).unwrap())
                    .unwrap_or_else(|e| panic!("{folder}/vendor.json: {e}"));
            assert!(dir.join("SOURCES.md").is_file(), "{folder}: SOURCES.md");
            let resources = load_resources(&dir).unwrap();
            assert!(
                resources
                    .keys()
                    .any(|k| is_system_path(&normalize(k, true))),
                "{folder}: no System"
            );
            assert!(profile.address_scheme.ends_with("+http"), "{folder}");
        }
    }

    #[test]
    fn paths_are_normalised_the_vendors_way() {
        assert_eq!(normalize("/redfish/v1/", false), "/redfish/v1");
        assert_eq!(
            normalize("/Redfish/V1/Systems/1/", true),
            "/redfish/v1/systems/1"
        );
        assert_eq!(normalize("/", false), "/");
        assert!(is_system_path("/redfish/v1/Systems/Node0"));
        assert!(!is_system_path("/redfish/v1/Systems"));
        assert!(!is_system_path("/redfish/v1/Systems/1/ResetActionInfo"));
    }

    #[test]
    fn power_changes_take_their_time() {
        let now = Instant::now();
        let mut p = Power {
            on: true,
            schedule: VecDeque::from([(now + Duration::from_secs(1), false)]),
        };
        assert_eq!(p.shown(now, true), "PoweringOff");
        assert_eq!(p.shown(now, false), "On");
        assert_eq!(p.shown(now + Duration::from_secs(2), true), "Off");
    }
}
