//! Redfish sessions: logging in where the service root says (`Links.Sessions`), following a
//! BMC's redirects on the same host without losing the method, body or credentials, and
//! logging out before the caller goes away.

use serde::Deserialize;

use super::{Auth, AuthState, RedfishDriver, Reply, SESSIONS_PATH};
use crate::address::endpoint_of;
use crate::error::BmcError;
use reqwest::header::LOCATION;
use reqwest::{Method, StatusCode};
use url::Url;

/// The service root (DSP0266 §9.1: it needs no authentication).
const SERVICE_ROOT: &str = "/redfish/v1/";
/// Redirects followed for one request.
const MAX_REDIRECTS: usize = 5;

#[derive(Deserialize)]
struct ServiceRoot {
    #[serde(rename = "Links")]
    links: Option<RootLinks>,
}

#[derive(Deserialize)]
struct RootLinks {
    #[serde(rename = "Sessions")]
    sessions: Option<OdataLink>,
}

#[derive(Deserialize)]
struct OdataLink {
    #[serde(rename = "@odata.id")]
    odata_id: Option<String>,
}

fn is_followed_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

impl RedfishDriver {
    /// [`RedfishDriver::send`], following the BMC's redirects itself: only on the same scheme,
    /// host and port, at most [`MAX_REDIRECTS`] times, re-sending the same method, body and
    /// credentials (HTTP clients turn a redirected POST into a GET without body, which a BMC
    /// then answers 401). A 303 continues with a GET, as HTTP says.
    pub(super) async fn send_following(
        &self,
        method: Method,
        url: Url,
        body: Option<&serde_json::Value>,
        auth: Option<&Auth>,
    ) -> Result<Reply, BmcError> {
        let original = url.path().to_string();
        let (mut method, mut url, mut body) = (method, url, body);
        for _ in 0..=MAX_REDIRECTS {
            let reply = self.send(method.clone(), url.clone(), body, auth).await?;
            if !is_followed_redirect(reply.status) {
                return Ok(reply);
            }
            let status = reply.status.as_u16();
            let Some(location) = reply.headers.get(LOCATION).and_then(|v| v.to_str().ok()) else {
                return Err(BmcError::InvalidResponse {
                    endpoint: self.endpoint.clone(),
                    path: original,
                    detail: format!(
                        "HTTP {status} redirect for {method} {} without a Location header",
                        url.path()
                    ),
                });
            };
            let next = url.join(location).map_err(|e| BmcError::InvalidResponse {
                endpoint: self.endpoint.clone(),
                path: original.clone(),
                detail: format!("HTTP {status} redirect to an unusable Location: {e}"),
            })?;
            if endpoint_of(&next) != self.endpoint {
                return Err(BmcError::RedirectRefused {
                    endpoint: self.endpoint.clone(),
                    path: original,
                    target: endpoint_of(&next),
                });
            }
            if status == 303 {
                method = Method::GET;
                body = None;
            }
            // The Location is the BMC's: it may repeat the password (percent-encoded).
            tracing::debug!(
                endpoint = %self.endpoint,
                from = %self.bmc_text(url.path()),
                to = %self.bmc_text(next.path()),
                status,
                "following the BMC's redirect"
            );
            url = next;
        }
        Err(BmcError::InvalidResponse {
            endpoint: self.endpoint.clone(),
            path: original,
            detail: format!(
                "more than {MAX_REDIRECTS} redirects (the last to {}); the BMC's redirects loop, \
                 check its firmware or the address",
                url.path()
            ),
        })
    }

    /// Where to POST a login: the service root's `Links.Sessions` (a path on this BMC), else
    /// DSP0266's usual `/redfish/v1/SessionService/Sessions` (some BMCs serve no service root,
    /// or one without the link).
    pub(super) async fn sessions_path(&self) -> String {
        match self.service_root_sessions().await {
            Ok(Some(path)) => path,
            Ok(None) => SESSIONS_PATH.to_string(),
            Err(e) => {
                tracing::debug!(
                    endpoint = %self.endpoint,
                    error = %self.scrub_error(e),
                    "no Links.Sessions from the service root; using {SESSIONS_PATH}"
                );
                SESSIONS_PATH.to_string()
            }
        }
    }

    async fn service_root_sessions(&self) -> Result<Option<String>, BmcError> {
        let url = self.url(SERVICE_ROOT)?;
        let reply = self.send_following(Method::GET, url, None, None).await?;
        if !reply.status.is_success() {
            return Ok(None);
        }
        let Ok(root) = serde_json::from_slice::<ServiceRoot>(&reply.body) else {
            return Ok(None);
        };
        let Some(path) = root
            .links
            .and_then(|l| l.sessions)
            .and_then(|s| s.odata_id)
            .filter(|p| !p.trim().is_empty())
        else {
            return Ok(None);
        };
        // Only a place on this BMC: the login carries the password.
        let url = self.url(&path)?;
        Ok(Some(url.path().to_string()))
    }

    /// Where the new session lives, from the login's answer: its `Location` (when that names
    /// another host, as BMCs behind a different name do, the same path here: the token never
    /// leaves this endpoint), else the session body's `@odata.id`.
    pub(super) fn session_url(&self, reply: &Reply) -> Option<Url> {
        let from_location = reply
            .headers
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|location| {
                let absolute = self.address.base_url.join(location).ok()?;
                self.url(absolute.path()).ok()
            });
        from_location.or_else(|| {
            let body: serde_json::Value = serde_json::from_slice(&reply.body).ok()?;
            let id = body.get("@odata.id")?.as_str()?;
            self.url(id).ok()
        })
    }

    /// Closes this driver's Redfish session, if it has one (DELETE on the session; an answer
    /// of 401 or 404 means the BMC already forgot it). Bounded by the request timeout of each
    /// exchange. The next call logs in again.
    pub async fn logout(&self) -> Result<(), BmcError> {
        // Not while a login is under way: its session would stay open.
        let _login = self.login_lock.lock().await;
        let AuthState::Session { token, location } = self.auth_state() else {
            return Ok(());
        };
        self.set_auth_state(AuthState::Unresolved);
        let Some(location) = location else {
            tracing::warn!(
                endpoint = %self.endpoint,
                "the BMC did not say where the session lives (no Location, no @odata.id); \
                 it stays open until the BMC's session timeout"
            );
            return Ok(());
        };
        let path = location.path().to_string();
        let reply = self
            .send_following(Method::DELETE, location, None, Some(&Auth::Token(token)))
            .await?;
        match reply.status {
            status if status.is_success() => {
                tracing::debug!(endpoint = %self.endpoint, "closed the Redfish session");
                Ok(())
            }
            StatusCode::UNAUTHORIZED | StatusCode::NOT_FOUND => Ok(()),
            _ => Err(self.status_error(&Method::DELETE, &path, &reply)),
        }
    }
}
