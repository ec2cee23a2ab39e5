//! Errors of the power layer. Each says what failed and what to do about it; none contains a
//! password (URLs never carry credentials, command lines never contain the password, and
//! every text field of an error a driver returns is scrubbed, see [`BmcError::scrubbed`]).
//! Text fields are bounded, see [`BmcError::bounded`].

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

    /// The BMC's name resolved outside the operator's BMC networks (or there are none):
    /// nothing was sent. Not transient: it lasts until DNS or `--bmc-networks` changes.
    #[error(transparent)]
    DestinationRefused(#[from] crate::destination::DestinationRefused),

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

    // No elapsed time in the text: it becomes a host's errorMessage and Event note, which must
    // stay the same from one failed read to the next (one Event series, no status rewrite).
    #[error("{operation} still failing after {attempts} attempts: {last}")]
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
    pub fn bounded(mut self) -> BmcError {
        self.for_each_text(&mut crate::text::clip_in_place);
        self
    }

    /// The error without the password in any text field ([`crate::text::scrub_secret`]):
    /// a hostile BMC may put it anywhere the driver copies from — a reset target, a list of
    /// reset types, a redirect's or a session's location, an error page. Drivers that hold
    /// credentials return errors through this (before [`BmcError::bounded`], so a cut never
    /// leaves part of a password behind).
    pub fn scrubbed(self, username: &str, password: &str) -> BmcError {
        self.scrubbed_of(&crate::text::Secrets::new(username, password))
    }

    /// [`BmcError::scrubbed`] for all the secrets of a connection (session tokens too).
    pub fn scrubbed_of(mut self, secrets: &crate::text::Secrets<'_>) -> BmcError {
        self.for_each_text(&mut |text: &mut String| {
            let clean = crate::text::scrub(text, secrets);
            if clean != *text {
                *text = clean;
            }
        });
        self
    }

    /// Calls `f` on every text field, the nested error's included.
    fn for_each_text(&mut self, f: &mut dyn FnMut(&mut String)) {
        for text in self.text_fields() {
            f(text);
        }
    }

    /// Every text field, the nested error's included, in declaration order.
    fn text_fields(&mut self) -> Vec<&mut String> {
        match self {
            BmcError::Address(address) => vec![&mut address.address, &mut address.reason],
            BmcError::AuthenticationFailed { endpoint, detail }
            | BmcError::Certificate { endpoint, detail }
            | BmcError::Connection { endpoint, detail } => vec![endpoint, detail],
            BmcError::PermissionDenied {
                endpoint,
                method,
                path,
            } => vec![endpoint, method, path],
            BmcError::SystemNotFound { endpoint, path } => vec![endpoint, path],
            BmcError::SystemAmbiguous {
                endpoint, members, ..
            } => vec![endpoint, members],
            BmcError::Unsupported {
                driver,
                operation,
                reason,
            } => vec![driver, operation, reason],
            BmcError::Timeout { what, .. } | BmcError::OutcomeUnknown { what, .. } => vec![what],
            BmcError::DestinationRefused(refused) => refused.text_fields(),
            BmcError::Http {
                endpoint,
                method,
                path,
                message,
                ..
            } => {
                vec![endpoint, method, path, message]
            }
            BmcError::InvalidResponse {
                endpoint,
                path,
                detail,
            } => vec![endpoint, path, detail],
            BmcError::RedirectRefused {
                endpoint,
                path,
                target,
            } => vec![endpoint, path, target],
            BmcError::RetriesExhausted {
                operation, last, ..
            } => {
                let mut fields = vec![operation];
                fields.extend(last.text_fields());
                fields
            }
            BmcError::IpmitoolMissing { path } => vec![path],
            BmcError::Ipmitool {
                endpoint,
                operation,
                status,
                stderr,
                ..
            } => {
                vec![endpoint, operation, status, stderr]
            }
            BmcError::IpmitoolOutput {
                endpoint,
                operation,
                output,
            } => {
                vec![endpoint, operation, output]
            }
            BmcError::Command {
                command,
                status,
                stdout,
                stderr,
            } => {
                vec![command, status, stdout, stderr]
            }
            BmcError::Spawn { program, detail } => vec![program, detail],
            BmcError::Config(detail) => vec![detail],
            BmcError::PowerStateNotReached { expected, last, .. } => vec![expected, last],
        }
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
            BmcError::DestinationRefused(_) => "DestinationRefused",
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

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use std::time::Duration;

    use super::*;

    const USER: &str = "admin";
    const PASSWORD: &str = "Sekr1t/pa ss";

    /// Every variant, with the password (as is, and percent-encoded) in every text field.
    fn every_variant() -> Vec<BmcError> {
        let t = || format!("x {PASSWORD} y Sekr1t%2Fpa%20ss z");
        let mut address =
            crate::address::BmcAddress::parse("bogus://h").expect_err("not an address");
        address.address = t();
        address.reason = t();
        let after = Duration::from_secs(1);
        vec![
            BmcError::Address(address),
            BmcError::AuthenticationFailed {
                endpoint: t(),
                detail: t(),
            },
            BmcError::PermissionDenied {
                endpoint: t(),
                method: t(),
                path: t(),
            },
            BmcError::SystemNotFound {
                endpoint: t(),
                path: t(),
            },
            BmcError::SystemAmbiguous {
                endpoint: t(),
                count: 2,
                members: t(),
            },
            BmcError::Unsupported {
                driver: t(),
                operation: t(),
                reason: t(),
            },
            BmcError::Certificate {
                endpoint: t(),
                detail: t(),
            },
            BmcError::Connection {
                endpoint: t(),
                detail: t(),
            },
            BmcError::Timeout { what: t(), after },
            BmcError::OutcomeUnknown { what: t(), after },
            BmcError::DestinationRefused(
                crate::destination::DestinationRefused::ResolvesOutsideNetworks {
                    host: t(),
                    address: t(),
                },
            ),
            BmcError::Http {
                endpoint: t(),
                method: t(),
                path: t(),
                status: 500,
                message: t(),
                retry_after: None,
            },
            BmcError::InvalidResponse {
                endpoint: t(),
                path: t(),
                detail: t(),
            },
            BmcError::RedirectRefused {
                endpoint: t(),
                path: t(),
                target: t(),
            },
            BmcError::RetriesExhausted {
                operation: t(),
                attempts: 4,
                elapsed: after,
                last: Box::new(BmcError::Http {
                    endpoint: t(),
                    method: t(),
                    path: t(),
                    status: 503,
                    message: t(),
                    retry_after: None,
                }),
            },
            BmcError::IpmitoolMissing { path: t() },
            BmcError::Ipmitool {
                endpoint: t(),
                operation: t(),
                status: t(),
                stderr: t(),
                transient: false,
            },
            BmcError::IpmitoolOutput {
                endpoint: t(),
                operation: t(),
                output: t(),
            },
            BmcError::Command {
                command: t(),
                status: t(),
                stdout: t(),
                stderr: t(),
            },
            BmcError::Spawn {
                program: t(),
                detail: t(),
            },
            BmcError::Config(t()),
            BmcError::PowerStateNotReached {
                expected: t(),
                after,
                last: t(),
            },
        ]
    }

    #[test]
    fn scrubbed_errors_hold_the_password_in_no_field() {
        for error in every_variant() {
            let reason = error.reason();
            let before = format!("{error} {error:?}");
            assert!(
                before.contains(PASSWORD),
                "{reason}: the case has the password"
            );
            let scrubbed = error.scrubbed(USER, PASSWORD);
            assert_eq!(scrubbed.reason(), reason, "the kind is kept");
            for text in [scrubbed.to_string(), format!("{scrubbed:?}")] {
                assert!(!text.contains("Sekr1t"), "{reason}: {text}");
                assert!(
                    text.contains("x <redacted> y <redacted> z"),
                    "{reason}: {text}"
                );
            }
        }
    }

    #[test]
    fn scrubbing_keeps_errors_without_the_password() {
        let error = BmcError::Http {
            endpoint: "https://10.0.0.5:443".into(),
            method: "GET".into(),
            path: "/redfish/v1/Systems/a%20b".into(),
            status: 500,
            message: ": internal error".into(),
            retry_after: Some(Duration::from_secs(3)),
        };
        let before = error.to_string();
        let after = error.scrubbed(USER, PASSWORD);
        assert_eq!(after.to_string(), before);
        assert_eq!(after.retry_after(), Some(Duration::from_secs(3)));
    }
}
