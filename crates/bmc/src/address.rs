//! BMC addresses as written in metal3's `spec.bmc.address`.
//!
//! Redfish: `redfish://host[:port]/redfish/v1/Systems/<id>` and its variants
//! (`redfish+http`, `redfish+https`, `redfish-virtualmedia`, `idrac-redfish`,
//! `idrac-virtualmedia`, `ilo5-redfish`, each also with `+http`/`+https`). HTTPS unless the
//! scheme ends in `+http`. The path names the System; without one the driver uses the only
//! member of the Systems collection.
//!
//! IPMI: `ipmi://host[:port]` or a bare `host[:port]`, port 623 by default.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use url::Url;

/// Every scheme the parser accepts, for error messages and docs.
pub const SUPPORTED_SCHEMES: &[&str] = &[
    "redfish",
    "redfish+http",
    "redfish+https",
    "redfish-virtualmedia",
    "idrac-redfish",
    "idrac-virtualmedia",
    "ilo5-redfish",
    "ipmi",
];

/// The default IPMI (RMCP+) UDP port.
pub const DEFAULT_IPMI_PORT: u16 = 623;

/// Redfish flavours that metal3 distinguishes. The power layer treats them all as plain
/// Redfish; the flavour is kept for descriptions and for callers that care (virtual media).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedfishFlavor {
    Redfish,
    RedfishVirtualMedia,
    IdracRedfish,
    IdracVirtualMedia,
    Ilo5Redfish,
}

impl RedfishFlavor {
    fn from_scheme_base(base: &str) -> Option<Self> {
        Some(match base {
            "redfish" => RedfishFlavor::Redfish,
            "redfish-virtualmedia" => RedfishFlavor::RedfishVirtualMedia,
            "idrac-redfish" => RedfishFlavor::IdracRedfish,
            "idrac-virtualmedia" => RedfishFlavor::IdracVirtualMedia,
            "ilo5-redfish" => RedfishFlavor::Ilo5Redfish,
            _ => return None,
        })
    }

    pub fn scheme(self) -> &'static str {
        match self {
            RedfishFlavor::Redfish => "redfish",
            RedfishFlavor::RedfishVirtualMedia => "redfish-virtualmedia",
            RedfishFlavor::IdracRedfish => "idrac-redfish",
            RedfishFlavor::IdracVirtualMedia => "idrac-virtualmedia",
            RedfishFlavor::Ilo5Redfish => "ilo5-redfish",
        }
    }
}

/// A host name or IP literal, without brackets.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BmcHost {
    Ip(IpAddr),
    Name(String),
}

impl fmt::Display for BmcHost {
    /// Formats the host for use in a URL authority: IPv6 literals get brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BmcHost::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            BmcHost::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            BmcHost::Name(name) => f.write_str(name),
        }
    }
}

impl BmcHost {
    /// The host as a command-line tool wants it: IPv6 without brackets.
    pub fn bare(&self) -> String {
        match self {
            BmcHost::Ip(ip) => ip.to_string(),
            BmcHost::Name(name) => name.clone(),
        }
    }
}

/// A parsed Redfish address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedfishAddress {
    pub flavor: RedfishFlavor,
    /// `https://host:port` or `http://host:port`, no path.
    pub base_url: Url,
    /// The System's path, e.g. `/redfish/v1/Systems/1`; `None` to discover it.
    pub system_path: Option<String>,
}

impl RedfishAddress {
    /// `host:port` — the key for per-endpoint limits and the name used in messages.
    pub fn endpoint(&self) -> String {
        endpoint_of(&self.base_url)
    }
}

/// `scheme://host:port` of a URL, the form used in messages.
pub(crate) fn endpoint_of(url: &Url) -> String {
    let host = match url.host() {
        Some(url::Host::Ipv6(ip)) => format!("[{ip}]"),
        Some(host) => host.to_string(),
        None => String::new(),
    };
    match url.port_or_known_default() {
        Some(port) => format!("{}://{host}:{port}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    }
}

/// A parsed IPMI address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpmiAddress {
    pub host: BmcHost,
    pub port: u16,
}

impl IpmiAddress {
    pub fn endpoint(&self) -> String {
        format!("ipmi://{}:{}", self.host, self.port)
    }
}

/// A BMC address, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BmcAddress {
    Redfish(RedfishAddress),
    Ipmi(IpmiAddress),
}

impl BmcAddress {
    /// Parses a metal3-style BMC address.
    pub fn parse(raw: &str) -> Result<BmcAddress, AddressError> {
        parse(raw)
    }

    /// The endpoint (scheme, host and port) the address points at.
    pub fn endpoint(&self) -> String {
        match self {
            BmcAddress::Redfish(r) => r.endpoint(),
            BmcAddress::Ipmi(i) => i.endpoint(),
        }
    }
}

impl std::str::FromStr for BmcAddress {
    type Err = AddressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}

impl fmt::Display for BmcAddress {
    /// A canonical form that parses back to the same address (`redfish://host:port/path`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BmcAddress::Redfish(r) => {
                let transport = if r.base_url.scheme() == "http" {
                    "+http"
                } else {
                    ""
                };
                let authority = endpoint_of(&r.base_url);
                let authority = authority.split_once("://").map_or("", |(_, a)| a);
                let path = r.system_path.as_deref().unwrap_or("");
                write!(f, "{}{transport}://{authority}{path}", r.flavor.scheme())
            }
            BmcAddress::Ipmi(i) => f.write_str(&i.endpoint()),
        }
    }
}

/// Why an address was rejected. The address is echoed with any `user:password@` removed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid BMC address {address:?}: {reason}; supported forms: redfish://host[:port]/redfish/v1/Systems/<id> \
     (schemes: {schemes}), or ipmi://host[:port] or a bare host[:port] for IPMI"
)]
pub struct AddressError {
    pub address: String,
    pub reason: String,
    schemes: String,
}

impl AddressError {
    fn new(raw: &str, reason: impl Into<String>) -> Self {
        AddressError {
            address: redact_userinfo(raw),
            reason: reason.into(),
            schemes: SUPPORTED_SCHEMES.join(", "),
        }
    }
}

/// Removes a `user[:password]@` part so an address can be echoed safely, whatever the
/// password contains. A password may hold `/`, `?`, `#`, `@` or `:`, so the authority cannot
/// be told apart reliably: everything up to the last `@` goes when that `@` is in the
/// apparent authority or has a `:` (the user/password separator) anywhere before it. Only a
/// path holding an `@` but no `:` is kept as is (it cannot hide a `user:password`).
pub fn redact_userinfo(raw: &str) -> String {
    let (prefix, rest) = split_scheme(raw);
    let Some(last_at) = rest.rfind('@') else {
        return raw.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if last_at < authority_end || rest[..last_at].contains(':') {
        format!("{prefix}<redacted>@{}", &rest[last_at + 1..])
    } else {
        raw.to_string()
    }
}

/// `("scheme://", rest)` when `raw` starts with one of the schemes we know (with an optional
/// `+http`/`+https` tail); `("", raw)` otherwise: `admin://?@host` is the user `admin` with a
/// password starting `//`, not a scheme, and must not shield the password from redaction.
fn split_scheme(raw: &str) -> (&str, &str) {
    if let Some(i) = raw.find("://") {
        let scheme = raw[..i].trim_start().to_ascii_lowercase();
        let base = scheme
            .strip_suffix("+https")
            .or_else(|| scheme.strip_suffix("+http"))
            .unwrap_or(&scheme);
        if SUPPORTED_SCHEMES.contains(&scheme.as_str()) || SUPPORTED_SCHEMES.contains(&base) {
            return raw.split_at(i + 3);
        }
    }
    ("", raw)
}

fn parse(raw: &str) -> Result<BmcAddress, AddressError> {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Err(AddressError::new(raw, "the address is empty"));
    }
    // Before anything that could quote a part of the address: an `@` means credentials
    // (a password may contain `/`, `#` or spaces that would confuse later checks).
    if trimmed.contains('@') {
        return Err(AddressError::new(
            raw,
            "it contains '@': credentials must not be part of the address; put them in the \
             credentials Secret",
        ));
    }
    if trimmed.chars().any(char::is_whitespace) {
        return Err(AddressError::new(raw, "the address contains whitespace"));
    }
    let Some(scheme_end) = trimmed.find("://") else {
        return parse_bare_ipmi(raw, trimmed);
    };
    let scheme = trimmed[..scheme_end].to_ascii_lowercase();
    if scheme == "ipmi" {
        let url = parse_url(raw, trimmed)?;
        reject_extras(raw, &url, false)?;
        let host = host_of(raw, &url)?;
        let port = url.port().unwrap_or(DEFAULT_IPMI_PORT);
        return Ok(BmcAddress::Ipmi(IpmiAddress { host, port }));
    }
    let (base, transport) = match scheme.split_once('+') {
        Some((base, "http")) => (base, "http"),
        Some((base, "https")) => (base, "https"),
        Some(_) => return Err(unsupported_scheme(raw, &scheme)),
        None => (scheme.as_str(), "https"),
    };
    let Some(flavor) = RedfishFlavor::from_scheme_base(base) else {
        return Err(unsupported_scheme(raw, &scheme));
    };
    let url = parse_url(raw, trimmed)?;
    reject_extras(raw, &url, true)?;
    let host = host_of(raw, &url)?;
    let default_port = if transport == "https" { 443 } else { 80 };
    let port = url.port().unwrap_or(default_port);
    let base_url = Url::parse(&format!("{transport}://{host}:{port}/"))
        .map_err(|e| AddressError::new(raw, format!("cannot build the Redfish URL: {e}")))?;
    let path = url.path().trim_end_matches('/');
    let system_path = if path.is_empty() {
        None
    } else {
        Some(path.to_string())
    };
    Ok(BmcAddress::Redfish(RedfishAddress {
        flavor,
        base_url,
        system_path,
    }))
}

fn unsupported_scheme(raw: &str, scheme: &str) -> AddressError {
    AddressError::new(raw, format!("unsupported scheme {scheme:?}"))
}

fn parse_url(raw: &str, trimmed: &str) -> Result<Url, AddressError> {
    Url::parse(trimmed).map_err(|e| AddressError::new(raw, format!("not a valid URL: {e}")))
}

fn reject_extras(raw: &str, url: &Url, path_allowed: bool) -> Result<(), AddressError> {
    if !url.username().is_empty() || url.password().is_some() {
        return Err(AddressError::new(
            raw,
            "credentials must not be part of the address; put them in the credentials Secret",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(AddressError::new(raw, "a query or fragment is not allowed"));
    }
    if !path_allowed && !url.path().trim_matches('/').is_empty() {
        return Err(AddressError::new(raw, "an IPMI address has no path"));
    }
    Ok(())
}

fn host_of(raw: &str, url: &Url) -> Result<BmcHost, AddressError> {
    match url.host() {
        None => Err(AddressError::new(raw, "the host is missing")),
        Some(url::Host::Ipv4(ip)) => Ok(BmcHost::Ip(IpAddr::V4(ip))),
        Some(url::Host::Ipv6(ip)) => Ok(BmcHost::Ip(IpAddr::V6(ip))),
        Some(url::Host::Domain(name)) => host_from_name(raw, name),
    }
}

/// Validates a host name (schemes like `redfish` are not "special" to the URL parser, so
/// their hosts arrive unchecked). Dotted-quad names are parsed as IPv4. An absolute name
/// (`r12.oob.`) is kept without its final dot: hostcycle resolves every BMC name as an
/// absolute name anyway (crate::resolve), and without the dot it is the same host for the
/// operator's networks, a Secret's address list, the TLS name and the `Host` header.
fn host_from_name(raw: &str, name: &str) -> Result<BmcHost, AddressError> {
    if name.is_empty() {
        return Err(AddressError::new(raw, "the host is missing"));
    }
    let name = crate::destination::without_final_dot(name);
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(BmcHost::Ip(ip));
    }
    let valid = name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    // A label starting `xn--` is an IDNA A-label and must hold valid Punycode, or the Redfish
    // URL cannot be built later; refuse it here for every scheme, with the same message.
    let valid = valid && url::Host::parse(name).is_ok();
    if valid {
        Ok(BmcHost::Name(name.to_ascii_lowercase()))
    } else {
        Err(AddressError::new(
            raw,
            format!("{name:?} is not a valid host name"),
        ))
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port` or an unbracketed IPv6 literal.
fn parse_bare_ipmi(raw: &str, text: &str) -> Result<BmcAddress, AddressError> {
    if let Ok(ip) = text.parse::<Ipv6Addr>() {
        return Ok(BmcAddress::Ipmi(IpmiAddress {
            host: BmcHost::Ip(IpAddr::V6(ip)),
            port: DEFAULT_IPMI_PORT,
        }));
    }
    if text.contains(['/', '?', '#', '@']) {
        return Err(AddressError::new(
            raw,
            "without a scheme the address must be host[:port] (IPMI)",
        ));
    }
    // Reuse the URL parser for brackets and ports.
    parse(&format!("ipmi://{text}")).map_err(|e| AddressError::new(raw, e.reason))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn redfish(raw: &str) -> RedfishAddress {
        match BmcAddress::parse(raw) {
            Ok(BmcAddress::Redfish(r)) => r,
            other => panic!("{raw}: expected Redfish, got {other:?}"),
        }
    }

    fn ipmi(raw: &str) -> IpmiAddress {
        match BmcAddress::parse(raw) {
            Ok(BmcAddress::Ipmi(i)) => i,
            other => panic!("{raw}: expected IPMI, got {other:?}"),
        }
    }

    #[test]
    fn redfish_defaults_to_https_and_keeps_the_system_path() {
        let r = redfish("redfish://10.0.0.5/redfish/v1/Systems/1");
        assert_eq!(r.flavor, RedfishFlavor::Redfish);
        assert_eq!(r.base_url.as_str(), "https://10.0.0.5/");
        assert_eq!(r.endpoint(), "https://10.0.0.5:443");
        assert_eq!(r.system_path.as_deref(), Some("/redfish/v1/Systems/1"));
    }

    #[test]
    fn redfish_transport_suffixes_and_ports() {
        let r = redfish("redfish+http://bmc.example.com:8000/redfish/v1/Systems/abc/");
        assert_eq!(r.base_url.as_str(), "http://bmc.example.com:8000/");
        assert_eq!(r.system_path.as_deref(), Some("/redfish/v1/Systems/abc"));
        let r = redfish("redfish+https://BMC.example.com");
        assert_eq!(r.base_url.as_str(), "https://bmc.example.com/");
        assert_eq!(r.system_path, None);
        let r = redfish("REDFISH+HTTP://127.0.0.1:80/");
        assert_eq!(r.endpoint(), "http://127.0.0.1:80");
    }

    #[test]
    fn vendor_flavors_are_redfish() {
        for (scheme, flavor) in [
            ("redfish-virtualmedia", RedfishFlavor::RedfishVirtualMedia),
            ("idrac-redfish", RedfishFlavor::IdracRedfish),
            ("idrac-virtualmedia", RedfishFlavor::IdracVirtualMedia),
            ("ilo5-redfish", RedfishFlavor::Ilo5Redfish),
        ] {
            let r = redfish(&format!(
                "{scheme}://192.168.1.2/redfish/v1/Systems/System.Embedded.1"
            ));
            assert_eq!(r.flavor, flavor);
            assert_eq!(r.base_url.scheme(), "https");
            let r = redfish(&format!(
                "{scheme}+http://192.168.1.2:8080/redfish/v1/Systems/1"
            ));
            assert_eq!(r.base_url.as_str(), "http://192.168.1.2:8080/");
        }
    }

    #[test]
    fn ipv6_literals() {
        let r = redfish("redfish://[fd00::5]:8443/redfish/v1/Systems/1");
        assert_eq!(r.base_url.as_str(), "https://[fd00::5]:8443/");
        assert_eq!(r.endpoint(), "https://[fd00::5]:8443");
        let i = ipmi("ipmi://[fe80::1]:6230");
        assert_eq!(i.host, BmcHost::Ip("fe80::1".parse().unwrap()));
        assert_eq!(i.port, 6230);
        assert_eq!(i.host.bare(), "fe80::1");
        assert_eq!(i.endpoint(), "ipmi://[fe80::1]:6230");
        assert_eq!(ipmi("[2001:db8::7]").port, 623);
        assert_eq!(
            ipmi("2001:db8::7").host,
            BmcHost::Ip("2001:db8::7".parse().unwrap())
        );
        assert_eq!(ipmi("[2001:db8::7]:700").port, 700);
    }

    #[test]
    fn ipmi_forms() {
        let i = ipmi("ipmi://10.1.2.3");
        assert_eq!((i.host.to_string(), i.port), ("10.1.2.3".into(), 623));
        let i = ipmi("10.1.2.3:6230");
        assert_eq!((i.host.to_string(), i.port), ("10.1.2.3".into(), 6230));
        let i = ipmi("bmc-7.rack3");
        assert_eq!((i.host.to_string(), i.port), ("bmc-7.rack3".into(), 623));
        let i = ipmi("IPMI://Bmc-7:1623/");
        assert_eq!((i.host.to_string(), i.port), ("bmc-7".into(), 1623));
    }

    #[test]
    fn absolute_names_are_accepted_without_their_final_dot() {
        let r = redfish("redfish://R12.oob./redfish/v1/Systems/1");
        assert_eq!(r.base_url.as_str(), "https://r12.oob/");
        assert_eq!(r.endpoint(), "https://r12.oob:443");
        let r = redfish("redfish+http://bmc.test.:8000");
        assert_eq!(r.endpoint(), "http://bmc.test:8000");
        let i = ipmi("ipmi://r12.oob.:6230");
        assert_eq!((i.host.to_string(), i.port), ("r12.oob".into(), 6230));
        let i = ipmi("r12.oob.");
        assert_eq!((i.host.to_string(), i.port), ("r12.oob".into(), 623));
        assert_eq!(
            BmcAddress::parse("redfish://r12.oob.").unwrap(),
            BmcAddress::parse("redfish://r12.oob").unwrap()
        );
        for raw in [
            "redfish://./",
            "redfish://r12.oob../",
            "ipmi://..",
            "r12..oob.",
        ] {
            assert!(
                BmcAddress::parse(raw).is_err(),
                "{raw:?} should be rejected"
            );
        }
    }

    #[test]
    fn display_is_canonical_and_parses_back() {
        for (raw, canonical) in [
            (
                "redfish://10.0.0.5/redfish/v1/Systems/1",
                "redfish://10.0.0.5:443/redfish/v1/Systems/1",
            ),
            (
                "redfish+https://h:8443/redfish/v1/Systems/1/",
                "redfish://h:8443/redfish/v1/Systems/1",
            ),
            (
                "redfish+http://[fd00::5]:8000/redfish/v1/Systems/x",
                "redfish+http://[fd00::5]:8000/redfish/v1/Systems/x",
            ),
            ("idrac-virtualmedia://h", "idrac-virtualmedia://h:443"),
            ("10.1.2.3", "ipmi://10.1.2.3:623"),
        ] {
            let parsed = BmcAddress::parse(raw).unwrap();
            assert_eq!(parsed.to_string(), canonical);
            assert_eq!(BmcAddress::parse(canonical).unwrap(), parsed);
        }
    }

    #[test]
    fn rejects_unknown_schemes_and_lists_the_supported_ones() {
        for raw in [
            "http://10.0.0.1/",
            "ilo4://x",
            "redfish+ftp://x",
            "libvirt://h",
            "idrac://h",
        ] {
            let err = BmcAddress::parse(raw).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("unsupported scheme"), "{msg}");
            assert!(
                msg.contains("redfish+http") && msg.contains("ipmi"),
                "{msg}"
            );
        }
    }

    #[test]
    fn rejects_malformed_addresses() {
        for raw in [
            "",
            "   ",
            "redfish://",
            "redfish:///redfish/v1/Systems/1",
            "ipmi://10.0.0.1/path",
            "ipmi://10.0.0.1:99999",
            "10.0.0.1:notaport",
            "host/with/path",
            "redfish://bad host/",
            "redfish://a..b/",
            "redfish://h/x?y=1",
            "redfish://h/x#frag",
            "redfish://-bad-/",
        ] {
            assert!(
                BmcAddress::parse(raw).is_err(),
                "{raw:?} should be rejected"
            );
        }
    }

    #[test]
    fn credentials_in_the_address_are_rejected_without_echoing_them() {
        for raw in [
            "redfish://admin:hunter2@10.0.0.1/redfish/v1/Systems/1",
            "ipmi://admin:hunter2@10.0.0.1",
            "admin:hunter2@10.0.0.1",
        ] {
            let err = BmcAddress::parse(raw).unwrap_err();
            let msg = err.to_string();
            assert!(!msg.contains("hunter2"), "{msg}");
            assert!(msg.contains("<redacted>@10.0.0.1"), "{msg}");
        }
    }

    #[test]
    fn passwords_with_url_delimiters_are_redacted() {
        for password in [
            "s3cretPW/x",
            "s3cret#PW",
            "s3cret?PW",
            "s3cret@PW",
            "s3cret:PW",
            "s3cret%2FPW",
            "s3cret PW",
            "s3cret://PW",
        ] {
            for raw in [
                format!("redfish://admin:{password}@10.0.0.1/redfish/v1/Systems/1"),
                format!("ipmi://admin:{password}@10.0.0.1"),
                format!("admin:{password}@10.0.0.1"),
                format!("redfish://:{password}@10.0.0.1"),
            ] {
                let err = BmcAddress::parse(&raw).unwrap_err();
                for text in [err.to_string(), format!("{err:?}"), redact_userinfo(&raw)] {
                    assert!(!text.contains("s3cret"), "{raw}: {text}");
                    assert!(!text.contains("PW"), "{raw}: {text}");
                }
                assert!(err.address.contains("<redacted>@10.0.0.1"), "{err}");
            }
        }
    }

    #[test]
    fn an_at_sign_anywhere_is_rejected() {
        let err = BmcAddress::parse("redfish://h/redfish/v1/Systems/a@b").unwrap_err();
        assert!(err.reason.contains("credentials"), "{err}");
    }

    #[test]
    fn redaction_leaves_plain_addresses_alone() {
        assert_eq!(redact_userinfo("redfish://h/a@b"), "redfish://h/a@b");
        assert_eq!(redact_userinfo("u:p@h:1"), "<redacted>@h:1");
        // A password starting `//` makes the user look like a scheme.
        assert_eq!(redact_userinfo("admin://?@10.0.0.1"), "<redacted>@10.0.0.1");
        assert_eq!(
            redact_userinfo("redfish://admin://?@10.0.0.1"),
            "redfish://<redacted>@10.0.0.1"
        );
    }
}
