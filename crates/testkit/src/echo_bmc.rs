//! A hostile Redfish BMC for secret audits (fault injection only): it accepts any credentials
//! and repeats what it was sent — the request line, every header (`Authorization` included),
//! the body, the decoded basic-auth `user:password`, and for session requests the login body
//! the token came from — in every place a client might copy into its errors, logs or status.
//! Each System is one trap ([`Trap`]); a test points one BareMetalHost (with its own
//! password) at each and then looks for the passwords everywhere.
//!
//! With [`EchoBmcOptions::sessions`] the service root advertises `Links.Sessions`: every other
//! login answers 500 with the login body echoed, the others 201 with a session whose
//! `Location` holds the password (percent-encoded), so a logout's error names it; every third
//! request with a token is refused with 401 (a session "expiring"), echoing the request.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::TestkitError;

const SESSIONS: &str = "/redfish/v1/SessionService/Sessions";
const SYSTEMS: &str = "/redfish/v1/Systems";
/// Longest request body repeated in an answer.
const MAX_ECHOED_BODY: usize = 4096;

/// What one System of the echo BMC does with what it is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Trap {
    /// GET of the System answers 500 with a Redfish error whose `message`,
    /// `@Message.ExtendedInfo[].Message` and `MessageArgs` repeat the request.
    ErrorPage,
    /// GET of the System answers 401 with the request repeated in the body.
    Unauthorized,
    /// A working System (power follows resets) whose reset types, listed only in its
    /// ActionInfo, include the password, the basic-auth header and the echo: a soft request
    /// falls back to hard and the reason lists them.
    ResetTypes,
    /// The System's reset target has the password in its path; the reset answers 500 with
    /// the request repeated.
    ResetTarget,
    /// GET of the System is redirected (307) to a path holding the password
    /// (percent-encoded), which answers 500 with the request repeated.
    Redirect,
}

impl Trap {
    pub const ALL: [Trap; 5] = [
        Trap::ErrorPage,
        Trap::Unauthorized,
        Trap::ResetTypes,
        Trap::ResetTarget,
        Trap::Redirect,
    ];

    /// The System's id (last path segment).
    pub fn id(self) -> &'static str {
        match self {
            Trap::ErrorPage => "echo-500",
            Trap::Unauthorized => "echo-401",
            Trap::ResetTypes => "echo-types",
            Trap::ResetTarget => "echo-target",
            Trap::Redirect => "echo-redirect",
        }
    }
}

/// How to start an [`EchoBmc`].
#[derive(Clone, Debug, Default)]
pub struct EchoBmcOptions {
    /// Advertise `Links.Sessions` and hand out sessions (see the module docs).
    pub sessions: bool,
}

/// One request as the echo BMC received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EchoRequest {
    pub method: String,
    pub path: String,
    /// The password it carried: basic auth, a login body, or the login behind its token.
    pub password: Option<String>,
}

#[derive(Default)]
struct Echoes {
    requests: Vec<EchoRequest>,
    /// Login body (as sent) by session token.
    sessions: BTreeMap<String, String>,
    logins: u64,
    token_requests: u64,
    /// Systems of [`Trap::ResetTypes`] that are off, by id.
    powered_off: BTreeSet<String>,
}

/// A running echo BMC on a loopback port; stops when dropped.
pub struct EchoBmc {
    port: u16,
    state: Arc<Mutex<Echoes>>,
    stop: CancellationToken,
}

impl Drop for EchoBmc {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[derive(Clone)]
struct AppState {
    sessions: bool,
    echoes: Arc<Mutex<Echoes>>,
}

impl EchoBmc {
    pub async fn start(options: EchoBmcOptions) -> Result<EchoBmc, TestkitError> {
        let (listener, port) = crate::process::bind_loopback("the echo BMC").await?;
        let state = Arc::new(Mutex::new(Echoes::default()));
        let app = Router::new().fallback(answer).with_state(AppState {
            sessions: options.sessions,
            echoes: state.clone(),
        });
        let stop = CancellationToken::new();
        let until = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { until.cancelled().await })
                .await;
        });
        Ok(EchoBmc { port, state, stop })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redfish+http://127.0.0.1:PORT/redfish/v1/Systems/<trap>`.
    pub fn address(&self, trap: Trap) -> String {
        format!(
            "redfish+http://127.0.0.1:{}{SYSTEMS}/{}",
            self.port,
            trap.id()
        )
    }

    /// Another System with the same trap and a power state of its own
    /// (`…/Systems/<trap>-<name>`), so two clients do not share one.
    pub fn address_of(&self, trap: Trap, name: &str) -> String {
        format!("{}-{name}", self.address(trap))
    }

    /// Every request received, oldest first.
    pub fn requests(&self) -> Vec<EchoRequest> {
        lock(&self.state).requests.clone()
    }

    /// The passwords the BMC has been sent (and so repeated), by the trap whose System the
    /// request was for (`None`: the service root, logins and sessions).
    pub fn passwords_by_trap(&self) -> BTreeMap<Option<Trap>, BTreeSet<String>> {
        let mut out: BTreeMap<Option<Trap>, BTreeSet<String>> = BTreeMap::new();
        for r in lock(&self.state).requests.iter() {
            if let Some(p) = &r.password {
                out.entry(trap_of(&r.path)).or_default().insert(p.clone());
            }
        }
        out
    }

    /// Logins answered (successful or not).
    pub fn logins(&self) -> u64 {
        lock(&self.state).logins
    }
}

fn lock(m: &Mutex<Echoes>) -> std::sync::MutexGuard<'_, Echoes> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// The System id of a request path: `/redfish/v1/Systems/<id>[/...]`.
fn system_of(path: &str) -> Option<&str> {
    path.strip_prefix(SYSTEMS)?
        .strip_prefix('/')?
        .split('/')
        .next()
}

/// The trap a request path belongs to: System `<trap>` or `<trap>-<name>`.
fn trap_of(path: &str) -> Option<Trap> {
    let id = system_of(path)?;
    Trap::ALL.into_iter().find(|t| {
        id == t.id()
            || id
                .strip_prefix(t.id())
                .is_some_and(|rest| rest.starts_with('-'))
    })
}

/// `text` percent-encoded except for RFC 3986's unreserved characters (for a header value).
pub fn percent_encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The decoded `user:password` of a basic `Authorization` header.
fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = value.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

fn login_password(body: &str) -> Option<String> {
    let value: Value = serde_json::from_str(body).ok()?;
    value.get("Password")?.as_str().map(str::to_string)
}

async fn answer(
    State(app): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut echoes = lock(&app.echoes);
    // 1. Record the request, and everything it told the BMC as a careless BMC repeats it.
    let request = Echoed::record(&mut echoes, method, &uri, &headers, &body);
    let path = request.path.as_str();
    // 2. The service root.
    if path == "/redfish/v1" || path == "/redfish/v1/" {
        return service_root(&app, &request);
    }
    // 3. Sessions: logins and logouts.
    if path.starts_with(SESSIONS) {
        return session(&app, &mut echoes, &request);
    }
    // 4. Every third request with a token finds its session "expired".
    if request.token.is_some() {
        echoes.token_requests += 1;
        if echoes.token_requests.is_multiple_of(3) {
            return request.error(StatusCode::UNAUTHORIZED);
        }
    }
    // 5. The Systems collection: one System per trap.
    if path.trim_end_matches('/') == SYSTEMS {
        return systems(&request);
    }
    // 6. The trap the System sets.
    let Some(trap) = trap_of(path) else {
        return request.error(StatusCode::NOT_FOUND);
    };
    spring(trap, &mut echoes, &request, &headers)
}

/// One request as the echo BMC saw it.
struct Echoed {
    method: Method,
    path: String,
    /// The body, cut to [`MAX_ECHOED_BODY`].
    body: String,
    token: Option<String>,
    /// Everything the request told the BMC.
    echo: String,
    /// The password the request carried (basic auth, a login body, or its session's login).
    secret: String,
}

impl Echoed {
    /// Reads the request and records it in `echoes`.
    fn record(
        echoes: &mut Echoes,
        method: Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &Bytes,
    ) -> Echoed {
        let path = uri.path().to_string();
        let body_text =
            String::from_utf8_lossy(&body[..body.len().min(MAX_ECHOED_BODY)]).into_owned();
        let token = headers
            .get("x-auth-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let session_body = token.as_ref().and_then(|t| echoes.sessions.get(t).cloned());
        let basic = basic_credentials(headers);
        let password = basic
            .as_ref()
            .map(|(_, p)| p.clone())
            .or_else(|| login_password(&body_text))
            .or_else(|| session_body.as_deref().and_then(login_password));
        echoes.requests.push(EchoRequest {
            method: method.to_string(),
            path: path.clone(),
            password: password.clone(),
        });
        let header_lines: Vec<String> = headers
            .iter()
            .map(|(name, value)| format!("{name}: {}", String::from_utf8_lossy(value.as_bytes())))
            .collect();
        let mut echo = format!(
            "cannot process {method} {uri} from {} with headers [{}] and body [{body_text}]",
            basic
                .as_ref()
                .map(|(u, p)| format!("{u}:{p}"))
                .unwrap_or_else(|| "(no basic auth)".into()),
            header_lines.join("; "),
        );
        if let Some(login) = &session_body {
            echo.push_str(&format!(" for the session opened by login [{login}]"));
        }
        Echoed {
            method,
            path,
            body: body_text,
            token,
            echo,
            secret: password.unwrap_or_default(),
        }
    }

    /// A Redfish error that repeats the request.
    fn error(&self, status: StatusCode) -> Response {
        redfish_error(status, &self.echo, &self.secret)
    }
}

/// The service root, its name repeating the request; it links the sessions when they are on.
fn service_root(app: &AppState, request: &Echoed) -> Response {
    let mut root = json!({
        "@odata.id": "/redfish/v1/",
        "Id": "RootService",
        "Name": format!("Echo BMC ({})", request.echo),
        "Systems": { "@odata.id": SYSTEMS },
    });
    if app.sessions {
        root["Links"] = json!({ "Sessions": { "@odata.id": SESSIONS } });
    }
    axum::Json(root).into_response()
}

/// A login (every other one fails with the request repeated; the others open a session whose
/// location holds the password), or a request to a session itself: a logout gets the echo in
/// an error.
fn session(app: &AppState, echoes: &mut Echoes, request: &Echoed) -> Response {
    if request.method != Method::POST || request.path.trim_end_matches('/') != SESSIONS {
        return request.error(StatusCode::INTERNAL_SERVER_ERROR);
    }
    echoes.logins += 1;
    if !app.sessions {
        return request.error(StatusCode::METHOD_NOT_ALLOWED);
    }
    if !echoes.logins.is_multiple_of(2) {
        return request.error(StatusCode::INTERNAL_SERVER_ERROR);
    }
    let secret = &request.secret;
    let token = format!("echo-token-{}", echoes.logins);
    echoes.sessions.insert(token.clone(), request.body.clone());
    let location = format!("{SESSIONS}/{}", percent_encode(secret));
    let mut response = (
        StatusCode::CREATED,
        axum::Json(json!({
            "@odata.id": location,
            "Id": secret,
            "UserName": login_body_field(&request.body, "UserName"),
            "Password": secret,
            "Description": request.echo,
        })),
    )
        .into_response();
    insert_header(&mut response, "x-auth-token", &token);
    insert_header(&mut response, "location", &location);
    response
}

/// The Systems collection, its description repeating the request.
fn systems(request: &Echoed) -> Response {
    let members: Vec<Value> = Trap::ALL
        .iter()
        .map(|t| json!({ "@odata.id": format!("{SYSTEMS}/{}", t.id()) }))
        .collect();
    axum::Json(json!({ "Members": members, "Description": request.echo })).into_response()
}

/// What the System of `trap` answers to the request.
fn spring(trap: Trap, echoes: &mut Echoes, request: &Echoed, headers: &HeaderMap) -> Response {
    let (path, echo, secret) = (&request.path, &request.echo, &request.secret);
    let id = system_of(path).unwrap_or(trap.id()).to_string();
    let system = format!("{SYSTEMS}/{id}");
    let is_system = path.trim_end_matches('/') == system;
    match trap {
        Trap::ErrorPage => request.error(StatusCode::INTERNAL_SERVER_ERROR),
        Trap::Unauthorized => {
            let mut response = (StatusCode::UNAUTHORIZED, echo.clone()).into_response();
            insert_header(&mut response, "www-authenticate", "Basic realm=\"echo\"");
            response
        }
        Trap::Redirect if is_system => {
            let mut response = StatusCode::TEMPORARY_REDIRECT.into_response();
            let location = format!("{system}/{}", percent_encode(secret));
            insert_header(&mut response, "location", &location);
            response
        }
        Trap::ResetTypes if is_system => {
            let power = if echoes.powered_off.contains(&id) {
                "Off"
            } else {
                "On"
            };
            axum::Json(json!({
                "@odata.id": system,
                "Id": id,
                "Name": echo,
                "PowerState": power,
                "Actions": { "#ComputerSystem.Reset": {
                    "target": format!("{system}/Actions/ComputerSystem.Reset"),
                    "@Redfish.ActionInfo": format!("{system}/ResetActionInfo"),
                }},
            }))
            .into_response()
        }
        Trap::ResetTypes if path.ends_with("/ResetActionInfo") => axum::Json(json!({
            "@odata.id": path,
            "Parameters": [{
                "Name": "ResetType",
                "AllowableValues": ["On", "ForceOff", "ForceRestart", secret,
                    headers.get(header::AUTHORIZATION)
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                        .unwrap_or_default(),
                    echo],
            }],
        }))
        .into_response(),
        Trap::ResetTypes if request.method == Method::POST => {
            match login_body_field(&request.body, "ResetType").as_str() {
                "ForceOff" => {
                    echoes.powered_off.insert(id);
                }
                "On" => {
                    echoes.powered_off.remove(&id);
                }
                _ => {}
            }
            StatusCode::NO_CONTENT.into_response()
        }
        Trap::ResetTarget if is_system => axum::Json(json!({
            "@odata.id": system,
            "Id": id,
            "PowerState": "On",
            "Actions": { "#ComputerSystem.Reset": {
                "target": format!("{system}/Actions/{secret}/ComputerSystem.Reset"),
                "ResetType@Redfish.AllowableValues":
                    ["On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart"],
            }},
        }))
        .into_response(),
        // The Redirect's target, and every other request: an error repeating the request.
        _ => request.error(StatusCode::INTERNAL_SERVER_ERROR),
    }
}

fn login_body_field(body: &str, field: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v.get(field).and_then(|f| f.as_str()).map(str::to_string))
        .unwrap_or_default()
}

fn insert_header(response: &mut Response, name: &'static str, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        response.headers_mut().insert(name, value);
    }
}

/// A Redfish error body repeating `echo` (and the password on its own) in every field.
fn redfish_error(status: StatusCode, echo: &str, secret: &str) -> Response {
    (
        status,
        axum::Json(json!({
            "error": {
                "code": "Base.1.0.GeneralError",
                "message": echo,
                "@Message.ExtendedInfo": [{
                    "MessageId": "Base.1.0.InternalError",
                    "Message": format!("the password {secret} is not accepted here: {echo}"),
                    "MessageArgs": [secret, echo],
                    "Resolution": format!("retry with a password other than {secret}"),
                }],
            }
        })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding_keeps_only_unreserved_characters() {
        assert_eq!(percent_encode("a-Z_0.~"), "a-Z_0.~");
        assert_eq!(percent_encode("p w/%\"é"), "p%20w%2F%25%22%C3%A9");
    }

    #[test]
    fn traps_are_found_by_path() {
        for trap in Trap::ALL {
            assert_eq!(trap_of(&format!("{SYSTEMS}/{}", trap.id())), Some(trap));
            assert_eq!(
                trap_of(&format!("{SYSTEMS}/{}/Actions/x", trap.id())),
                Some(trap)
            );
        }
        assert_eq!(
            trap_of(&format!("{SYSTEMS}/echo-types-cli/Actions/x")),
            Some(Trap::ResetTypes)
        );
        assert_eq!(trap_of(&format!("{SYSTEMS}/echo-typesx")), None);
        assert_eq!(trap_of("/redfish/v1/SessionService/Sessions"), None);
    }
}
