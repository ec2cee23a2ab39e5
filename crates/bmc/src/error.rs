//! Errors of the power layer. Each says what failed and what to do about it; none contains a
//! password (URLs never carry credentials, command lines never contain the password, and
//! BMC text is scrubbed by [`crate::text::from_bmc`]). Text fields are bounded, see
//! [`BmcError::bounded`].

use std::time::Duration;

use crate::address::AddressError;

/// A failed BMC operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BmcError {
    #[error(transparent)]
    Address(#[from] AddressError),

    #[error(
        "BMC {endpoint} rejected the credentials ({detail}); check the username and password in the \
         BMC credentials Secret"
    )]
    AuthenticationFailed { endpoint: String, detail: String },

    #[error(
        "BMC {endpoint} refused {method} {path} (HTTP 403 Forbidden); the BMC user needs a role that \
         may change power (e.g. Operator or Administrator)"
    )]
    PermissionDenied {
        endpoint: String,
        method: String,
        path: String,
    },

    #[error(
        "BMC {endpoint} has no Redfish System at {path} (HTTP 404); check the System path in the BMC \
         address (list them with GET /redfish/v1/Systems)"
    )]
    SystemNotFound { endpoint: String, path: String },

    #[error(
        "cannot tell which Redfish System to manage at {endpoint}: the Systems collection has \
         {count} members ({members}); put the System's path in the address, e.g. \
         redfish://host/redfish/v1/Systems/<id>"
    )]
    SystemAmbiguous {
        endpoint: String,
        count: usize,
        members: String,
    },

    #[error("{driver} cannot {operation}: {reason}")]
    Unsupported {
        driver: String,
        operation: String,
        reason: String,
    },

    #[error(
        "TLS certificate of BMC {endpoint} was not accepted: {detail}; give the BMC's CA bundle, or \
         disable certificate verification for this host (disableCertificateVerification / --insecure)"
    )]
    Certificate { endpoint: String, detail: String },

    #[error("could not reach BMC {endpoint}: {detail}")]
    Connection { endpoint: String, detail: String },

    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },

    #[error(
        "timed out after {after:?} waiting for {what}; it may or may not have taken effect, so it \
         was not repeated automatically: check the power state before trying again"
    )]
    OutcomeUnknown { what: String, after: Duration },

    #[error("BMC {endpoint} answered {method} {path} with HTTP {status}{message}")]
    Http {
        endpoint: String,
        method: String,
        path: String,
        status: u16,
        /// `": <Redfish error message>"` or empty.
        message: String,
        /// The server's Retry-After, when it sent one.
        retry_after: Option<Duration>,
    },

    #[error("BMC {endpoint} sent an unusable response to {path}: {detail}")]
    InvalidResponse {
        endpoint: String,
        path: String,
        detail: String,
    },

    #[error(
        "BMC {endpoint} redirected {path} to {target}, another host; refusing to follow so that \
         credentials stay with the BMC (fix the BMC address to point at the right host)"
    )]
    RedirectRefused {
        endpoint: String,
        path: String,
        target: String,
    },

    #[error("{operation} still failing after {attempts} attempts in {elapsed:?}: {last}")]
    RetriesExhausted {
        operation: String,
        attempts: u32,
        elapsed: Duration,
        #[source]
        last: Box<BmcError>,
    },

    #[error(
        "ipmitool was not found at {path}; install the `ipmitool` package (scripts/install-prereqs.sh \
         does) or set the path to it"
    )]
    IpmitoolMissing { path: String },

    #[error("ipmitool {operation} against {endpoint} failed ({status}): {stderr}")]
    Ipmitool {
        endpoint: String,
        operation: String,
        status: String,
        stderr: String,
        /// Whether trying again may help (no answer, session setup hiccups).
        transient: bool,
    },

    #[error("unexpected ipmitool output for {operation} against {endpoint}: {output:?}")]
    IpmitoolOutput {
        endpoint: String,
        operation: String,
        output: String,
    },

    #[error("command {command} failed ({status}); stdout: {stdout:?}; stderr: {stderr:?}")]
    Command {
        command: String,
        status: String,
        stdout: String,
        stderr: String,
    },

    #[error("could not run {program}: {detail}")]
    Spawn { program: String, detail: String },

    #[error("invalid BMC connection settings: {0}")]
    Config(String),

    #[error("the host did not reach power state {expected} within {after:?} (last seen: {last})")]
    PowerStateNotReached {
        expected: String,
        after: Duration,
        last: String,
    },
}

impl BmcError {
    /// Whether trying again later may succeed: connection problems, timeouts, 5xx and 429.
    /// Permanent errors (bad credentials, missing system, unsupported action, bad address)
    /// are not retried.
    pub fn is_transient(&self) -> bool {
        match self {
            BmcError::Connection { .. } | BmcError::Timeout { .. } => true,
            BmcError::Http { status, .. } => *status >= 500 || *status == 429 || *status == 408,
            BmcError::Ipmitool { transient, .. } => *transient,
            BmcError::RetriesExhausted { .. } => true,
            _ => false,
        }
    }

    /// The delay the BMC asked for with Retry-After, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            BmcError::Http { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The error with every text field cut to about 1 KiB ([`crate::text::clip`]): fields
    /// may hold what a BMC sent (paths, member ids, messages), and the error goes on into a
    /// host's status, Events and logs. Drivers return errors through this.
    pub fn bounded(self) -> BmcError {
        use crate::text::clip_in_place as clip;
        let mut error = self;
        match &mut error {
            BmcError::Address(address) => {
                clip(&mut address.address);
                clip(&mut address.reason);
            }
            BmcError::AuthenticationFailed { endpoint, detail }
            | BmcError::Certificate { endpoint, detail }
            | BmcError::Connection { endpoint, detail } => {
                clip(endpoint);
                clip(detail);
            }
            BmcError::PermissionDenied {
                endpoint,
                method,
                path,
            } => {
                clip(endpoint);
                clip(method);
                clip(path);
            }
            BmcError::SystemNotFound { endpoint, path } => {
                clip(endpoint);
                clip(path);
            }
            BmcError::SystemAmbiguous {
                endpoint, members, ..
            } => {
                clip(endpoint);
                clip(members);
            }
            BmcError::Unsupported {
                driver,
                operation,
                reason,
            } => {
                clip(driver);
                clip(operation);
                clip(reason);
            }
            BmcError::Timeout { what, .. } | BmcError::OutcomeUnknown { what, .. } => clip(what),
            BmcError::Http {
                endpoint,
                method,
                path,
                message,
                ..
            } => {
                clip(endpoint);
                clip(method);
                clip(path);
                clip(message);
            }
            BmcError::InvalidResponse {
                endpoint,
                path,
                detail,
            } => {
                clip(endpoint);
                clip(path);
                clip(detail);
            }
            BmcError::RedirectRefused {
                endpoint,
                path,
                target,
            } => {
                clip(endpoint);
                clip(path);
                clip(target);
            }
            BmcError::RetriesExhausted {
                operation, last, ..
            } => {
                clip(operation);
                let inner = std::mem::replace(last.as_mut(), BmcError::Config(String::new()));
                **last = inner.bounded();
            }
            BmcError::IpmitoolMissing { path } => clip(path),
            BmcError::Ipmitool {
                endpoint,
                operation,
                status,
                stderr,
                ..
            } => {
                clip(endpoint);
                clip(operation);
                clip(status);
                clip(stderr);
            }
            BmcError::IpmitoolOutput {
                endpoint,
                operation,
                output,
            } => {
                clip(endpoint);
                clip(operation);
                clip(output);
            }
            BmcError::Command {
                command,
                status,
                stdout,
                stderr,
            } => {
                clip(command);
                clip(status);
                clip(stdout);
                clip(stderr);
            }
            BmcError::Spawn { program, detail } => {
                clip(program);
                clip(detail);
            }
            BmcError::Config(detail) => clip(detail),
            BmcError::PowerStateNotReached { expected, last, .. } => {
                clip(expected);
                clip(last);
            }
        }
        error
    }

    /// A short machine-friendly reason, for status conditions and metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            BmcError::Address(_) => "InvalidAddress",
            BmcError::AuthenticationFailed { .. } => "AuthenticationFailed",
            BmcError::PermissionDenied { .. } => "PermissionDenied",
            BmcError::SystemNotFound { .. } => "SystemNotFound",
            BmcError::SystemAmbiguous { .. } => "SystemAmbiguous",
            BmcError::Unsupported { .. } => "Unsupported",
            BmcError::Certificate { .. } => "CertificateError",
            BmcError::Connection { .. } => "ConnectionFailed",
            BmcError::Timeout { .. } => "Timeout",
            BmcError::OutcomeUnknown { .. } => "OutcomeUnknown",
            BmcError::Http { .. } => "HttpError",
            BmcError::InvalidResponse { .. } => "InvalidResponse",
            BmcError::RedirectRefused { .. } => "RedirectRefused",
            BmcError::RetriesExhausted { last, .. } => last.reason(),
            BmcError::IpmitoolMissing { .. } => "IpmitoolMissing",
            BmcError::Ipmitool { .. } | BmcError::IpmitoolOutput { .. } => "IpmiError",
            BmcError::Command { .. } => "CommandFailed",
            BmcError::Spawn { .. } => "SpawnFailed",
            BmcError::Config(_) => "InvalidConfig",
            BmcError::PowerStateNotReached { .. } => "PowerStateNotReached",
        }
    }
}
