//! Where BMC credentials may be sent.
//!
//! Whoever may edit a BareMetalHost chooses its `spec.bmc.address` and names a credentials
//! Secret of the namespace, possibly one they cannot read. Without a limit, pointing the
//! address at a server of their own would make the operator log in there with the password.
//! Two limits close that, neither needing a change to metal3 hosts or Secrets as written:
//!
//! - the operator's BMC networks (`--bmc-networks`): CIDRs and DNS names or suffixes that
//!   BMCs live in. Credentials go nowhere else; with none configured they go nowhere, and
//!   the host's status says which flag to set (`any` restores metal3's behaviour);
//! - a Secret may narrow that further with the annotation [`ADDRESSES_ANNOTATION`]: then only
//!   the BMC hosts (or `host:port`) it lists get its credentials.
//!
//! Plain-HTTP Redfish (`redfish+http://`) sends the password in clear: refused unless the
//! operator allows it (`--allow-plain-http-bmc`). All checks here are pure.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

use crate::address::{BmcAddress, BmcHost};

/// Annotation of a credentials Secret: the BMC hosts its credentials may be sent to,
/// separated by commas or white space; each a host name, an IP literal (IPv6 with or without
/// brackets) or either with `:port`.
pub const ADDRESSES_ANNOTATION: &str = "hostcycle.io/bmc-addresses";

/// Longest annotation value read; a longer one is refused as a whole (it cannot be a list an
/// administrator wrote by hand, and it is never echoed).
pub const MAX_ADDRESSES_ANNOTATION: usize = 16 * 1024;

/// One entry of `--bmc-networks`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BmcNetwork {
    /// Every address: metal3's behaviour, for clusters where only trusted identities may
    /// edit hosts (documented in docs/security.md).
    Any,
    /// IP addresses in this network (`10.0.0.0/24`, `fd00::/64`; a bare IP is a /32 or /128).
    Cidr(IpNet),
    /// This DNS name exactly.
    Name(String),
    /// Names under this domain (written `.bmc.example.com` or `*.bmc.example.com`).
    Suffix(String),
}

impl FromStr for BmcNetwork {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let value = raw.trim();
        if value.eq_ignore_ascii_case("any") {
            return Ok(BmcNetwork::Any);
        }
        if let Ok(net) = value.parse::<IpNet>() {
            return Ok(BmcNetwork::Cidr(net.trunc()));
        }
        if let Ok(ip) = value.parse::<IpAddr>() {
            return Ok(BmcNetwork::Cidr(IpNet::from(ip)));
        }
        let (suffix, name) = match value.strip_prefix("*.").or_else(|| value.strip_prefix('.')) {
            Some(rest) => (true, rest),
            None => (false, value),
        };
        // An absolute name (`r12.oob.`) is the name: hostcycle resolves every BMC name as
        // an absolute one (crate::resolve), so the dot changes nothing.
        let name = without_final_dot(name);
        if !is_dns_name(name) {
            return Err(format!(
                "{:?} is not a BMC network: write a CIDR (10.0.0.0/24, fd00::/64), an IP, a DNS \
                 name (bmc1.example.com), a domain suffix (.bmc.example.com) or `any`",
                crate::text::clip_to(raw, 80)
            ));
        }
        let name = name.to_ascii_lowercase();
        Ok(if suffix {
            BmcNetwork::Suffix(name)
        } else {
            BmcNetwork::Name(name)
        })
    }
}

impl fmt::Display for BmcNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BmcNetwork::Any => f.write_str("any"),
            BmcNetwork::Cidr(net) => write!(f, "{net}"),
            BmcNetwork::Name(name) => f.write_str(name),
            BmcNetwork::Suffix(name) => write!(f, ".{name}"),
        }
    }
}

impl BmcNetwork {
    fn contains(&self, host: &BmcHost) -> bool {
        match (self, host) {
            (BmcNetwork::Any, _) => true,
            (BmcNetwork::Cidr(net), BmcHost::Ip(ip)) => net.contains(&canonical(*ip)),
            (BmcNetwork::Name(name), BmcHost::Name(host)) => host.eq_ignore_ascii_case(name),
            (BmcNetwork::Suffix(suffix), BmcHost::Name(host)) => {
                let host = host.to_ascii_lowercase();
                host.strip_suffix(suffix.as_str())
                    .is_some_and(|head| head.ends_with('.'))
            }
            _ => false,
        }
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) is the IPv4 address it maps: matched
/// against IPv4 networks, never slipping past them in its IPv6 form.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// `name` without the one final dot of an absolute name (`r12.oob.` → `r12.oob`); a lone
/// `.` stays (it is no name).
pub(crate) fn without_final_dot(name: &str) -> &str {
    match name.strip_suffix('.') {
        Some(head) if !head.is_empty() => head,
        _ => name,
    }
}

/// `host` is a DNS name: labels of letters, digits, `-` and `_`, not starting or ending
/// with `-`, at most 63 bytes each and 253 in all.
fn is_dns_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// The operator's limits on where credentials go (`--bmc-networks`, `--allow-plain-http-bmc`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CredentialDestinations {
    pub networks: Vec<BmcNetwork>,
    pub allow_plain_http: bool,
}

impl CredentialDestinations {
    /// No limit: every address, plain HTTP too (the `hostcycle bmc` CLI, where the caller
    /// types the password in themselves).
    pub fn unrestricted() -> Self {
        CredentialDestinations {
            networks: vec![BmcNetwork::Any],
            allow_plain_http: true,
        }
    }

    /// The configured networks as `--bmc-networks` takes them, for the operator's log (never
    /// for a host's status: a host editor learns only that their address was refused).
    pub fn networks_text(&self) -> String {
        networks_text(&self.networks)
    }

    /// May the credentials of a Secret annotated `secret_addresses` (the value of
    /// [`ADDRESSES_ANNOTATION`], if any) be sent to `address`?
    pub fn check(
        &self,
        address: &BmcAddress,
        secret_addresses: Option<&str>,
    ) -> Result<(), DestinationRefused> {
        let (host, port) = host_and_port(address);
        if let BmcAddress::Redfish(redfish) = address
            && redfish.base_url.scheme() == "http"
            && !self.allow_plain_http
        {
            return Err(DestinationRefused::PlainHttp {
                endpoint: address.endpoint(),
            });
        }
        if self.networks.is_empty() {
            return Err(DestinationRefused::NoNetworks {
                host: host.to_string(),
            });
        }
        if !self.networks.iter().any(|n| n.contains(&host)) {
            return Err(DestinationRefused::OutsideNetworks {
                host: host.to_string(),
            });
        }
        if let Some(listed) = secret_addresses {
            if listed.len() > MAX_ADDRESSES_ANNOTATION {
                return Err(DestinationRefused::BadAnnotation {
                    reason: format!("it is longer than {MAX_ADDRESSES_ANNOTATION} bytes"),
                });
            }
            let mut entries = listed
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|e| !e.is_empty())
                .peekable();
            if entries.peek().is_none() {
                return Err(DestinationRefused::BadAnnotation {
                    reason: "it lists no address".into(),
                });
            }
            let mut matched = false;
            for entry in entries {
                let (entry_host, entry_port) = parse_entry(entry)
                    .map_err(|reason| DestinationRefused::BadAnnotation { reason })?;
                if entry_host == host && entry_port.is_none_or(|p| p == port) {
                    matched = true;
                }
            }
            if !matched {
                return Err(DestinationRefused::NotListedBySecret {
                    endpoint: format!("{host}:{port}"),
                });
            }
        }
        Ok(())
    }
}

/// `networks` as `--bmc-networks` takes them (`none are configured` when empty).
pub fn networks_text(networks: &[BmcNetwork]) -> String {
    if networks.is_empty() {
        return "none are configured".into();
    }
    let list: Vec<String> = networks.iter().map(ToString::to_string).collect();
    list.join(",")
}

/// How a BMC's DNS name becomes the addresses the drivers connect to, under `networks`
/// (`--bmc-networks`); see [`crate::resolve`].
///
/// - With `any` among the networks (metal3's behaviour, and the `hostcycle bmc` CLI): the
///   system resolver, the name as written, search list included; no address is checked.
/// - Otherwise the name is resolved as an **absolute** name (never completed with the pod's
///   DNS search list, where a cluster Service could answer for it), and when the networks
///   hold CIDRs or IPs **every** address it resolves to must lie in one of them: a name
///   admitted by a name or suffix entry still cannot lead the credentials out of the
///   networks. With names and suffixes only, the administrator trusts those names' DNS:
///   their addresses are not checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameResolution {
    System,
    Absolute {
        /// The CIDR and IP entries; empty when only names or suffixes are configured.
        cidrs: Vec<IpNet>,
        /// No networks at all: no name may be resolved (nothing is sent anywhere).
        none_configured: bool,
    },
}

impl NameResolution {
    /// The rule for `networks` (see the type's documentation).
    pub fn for_networks(networks: &[BmcNetwork]) -> Self {
        if networks.contains(&BmcNetwork::Any) {
            return NameResolution::System;
        }
        NameResolution::Absolute {
            cidrs: networks
                .iter()
                .filter_map(|n| match n {
                    BmcNetwork::Cidr(net) => Some(*net),
                    _ => None,
                })
                .collect(),
            none_configured: networks.is_empty(),
        }
    }

    /// Whether names are resolved as absolute names.
    pub fn absolute(&self) -> bool {
        matches!(self, NameResolution::Absolute { .. })
    }

    /// May a driver connect to `addresses`, what `name` resolved to? All of them must be
    /// allowed: the resolver's order, or a connection attempt falling back to the next
    /// address, must not decide where credentials go.
    pub fn check_resolved(
        &self,
        name: &str,
        addresses: &[IpAddr],
    ) -> Result<(), DestinationRefused> {
        let NameResolution::Absolute {
            cidrs,
            none_configured,
        } = self
        else {
            return Ok(());
        };
        if *none_configured {
            return Err(DestinationRefused::NoNetworks {
                host: name.to_string(),
            });
        }
        if cidrs.is_empty() {
            return Ok(());
        }
        match addresses
            .iter()
            .map(|ip| canonical(*ip))
            .find(|ip| !cidrs.iter().any(|net| net.contains(ip)))
        {
            Some(outside) => Err(DestinationRefused::ResolvesOutsideNetworks {
                host: name.to_string(),
                address: outside.to_string(),
            }),
            None => Ok(()),
        }
    }
}

fn host_and_port(address: &BmcAddress) -> (BmcHost, u16) {
    match address {
        BmcAddress::Ipmi(ipmi) => (canonical_host(ipmi.host.clone()), ipmi.port),
        BmcAddress::Redfish(redfish) => {
            let host = match redfish.base_url.host() {
                Some(url::Host::Ipv4(ip)) => BmcHost::Ip(IpAddr::V4(ip)),
                Some(url::Host::Ipv6(ip)) => BmcHost::Ip(IpAddr::V6(ip)),
                Some(url::Host::Domain(name)) => match name.parse::<IpAddr>() {
                    Ok(ip) => BmcHost::Ip(ip),
                    Err(_) => BmcHost::Name(name.to_ascii_lowercase()),
                },
                None => BmcHost::Name(String::new()),
            };
            let port = redfish.base_url.port_or_known_default().unwrap_or(443);
            (canonical_host(host), port)
        }
    }
}

fn canonical_host(host: BmcHost) -> BmcHost {
    match host {
        BmcHost::Ip(ip) => BmcHost::Ip(canonical(ip)),
        BmcHost::Name(name) => BmcHost::Name(name.to_ascii_lowercase()),
    }
}

/// One entry of [`ADDRESSES_ANNOTATION`]: `host`, `host:port`, `v6`, `[v6]` or `[v6]:port`.
fn parse_entry(entry: &str) -> Result<(BmcHost, Option<u16>), String> {
    let invalid = || {
        format!(
            "{:?} is not a host, IP or host:port",
            crate::text::clip_to(entry, 80)
        )
    };
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Ok((BmcHost::Ip(canonical(ip)), None));
    }
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or_else(invalid)?;
        let ip = v6.parse::<IpAddr>().map_err(|_| invalid())?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(invalid)?),
        };
        (BmcHost::Ip(canonical(ip)), port)
    } else {
        let (host, port) = match entry.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (entry, None),
        };
        let host = without_final_dot(host);
        let host = match host.parse::<IpAddr>() {
            Ok(ip) => BmcHost::Ip(canonical(ip)),
            Err(_) if is_dns_name(host) => BmcHost::Name(host.to_ascii_lowercase()),
            Err(_) => return Err(invalid()),
        };
        (host, port)
    };
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(invalid)?,
        ),
    };
    Ok((host, port))
}

/// Why credentials were not sent. The messages name the flag or annotation to change and
/// never anything from the Secret but the annotation's verdict. They go into a host's
/// status, which every reader of hosts sees: they name the refused host, never the
/// operator's networks (the operator logs those, see [`networks_text`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestinationRefused {
    #[error(
        "BMC credentials are not sent to {host}: it is outside the operator's BMC networks; if \
         this is a BMC, add its network to `hostcycle operator --bmc-networks`"
    )]
    OutsideNetworks { host: String },
    #[error(
        "BMC credentials are not sent to {host}: it resolves to {address}, outside the \
         operator's BMC networks; if this is a BMC, add its network to `hostcycle operator \
         --bmc-networks`"
    )]
    ResolvesOutsideNetworks { host: String, address: String },
    #[error(
        "BMC credentials are not sent to {host}: the operator has no BMC networks (none are \
         configured); set `hostcycle operator --bmc-networks` to the BMCs' management network"
    )]
    NoNetworks { host: String },
    #[error(
        "BMC credentials are not sent over plain HTTP ({endpoint}): use redfish:// (HTTPS) or \
         start the operator with --allow-plain-http-bmc"
    )]
    PlainHttp { endpoint: String },
    #[error(
        "the credentials Secret does not list {endpoint} in its `hostcycle.io/bmc-addresses` \
         annotation: add it there (someone who may edit the Secret) or fix spec.bmc.address"
    )]
    NotListedBySecret { endpoint: String },
    #[error(
        "the credentials Secret's `hostcycle.io/bmc-addresses` annotation cannot be read ({reason}); \
         no credentials are sent until it is fixed"
    )]
    BadAnnotation { reason: String },
}

impl DestinationRefused {
    /// Every text field, for scrubbing and bounding inside a [`crate::BmcError`].
    pub(crate) fn text_fields(&mut self) -> Vec<&mut String> {
        match self {
            DestinationRefused::OutsideNetworks { host }
            | DestinationRefused::NoNetworks { host } => {
                vec![host]
            }
            DestinationRefused::ResolvesOutsideNetworks { host, address } => vec![host, address],
            DestinationRefused::PlainHttp { endpoint }
            | DestinationRefused::NotListedBySecret { endpoint } => vec![endpoint],
            DestinationRefused::BadAnnotation { reason } => vec![reason],
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn destinations(networks: &[&str], allow_plain_http: bool) -> CredentialDestinations {
        CredentialDestinations {
            networks: networks.iter().map(|n| n.parse().unwrap()).collect(),
            allow_plain_http,
        }
    }

    fn address(raw: &str) -> BmcAddress {
        BmcAddress::parse(raw).unwrap()
    }

    #[test]
    fn networks_parse_and_print() {
        for (raw, printed) in [
            ("10.0.0.0/24", "10.0.0.0/24"),
            ("10.0.0.7/24", "10.0.0.0/24"),
            ("10.0.0.7", "10.0.0.7/32"),
            ("fd00::/64", "fd00::/64"),
            ("::1", "::1/128"),
            ("bmc1.Example.com", "bmc1.example.com"),
            (".bmc.example.com", ".bmc.example.com"),
            ("*.bmc.example.com", ".bmc.example.com"),
            ("ANY", "any"),
            // Absolute names are the same names.
            ("r12.oob.", "r12.oob"),
            (".oob.", ".oob"),
            ("*.bmc.Example.com.", ".bmc.example.com"),
        ] {
            let network: BmcNetwork = raw.parse().unwrap();
            assert_eq!(network.to_string(), printed, "{raw}");
        }
        for bad in [
            "",
            "10.0.0.0/33",
            "-x.example",
            "a b",
            "http://x",
            "*.",
            ".",
            "..",
            "r12.oob..",
            ".oob..",
        ] {
            let err = bad.parse::<BmcNetwork>().unwrap_err();
            assert!(err.contains("is not a BMC network"), "{bad}: {err}");
        }
    }

    /// (networks, allow http, address, Secret annotation, expected refusal or None)
    #[test]
    fn where_credentials_may_go() {
        type Case = (
            &'static [&'static str],
            bool,
            &'static str,
            Option<&'static str>,
            Option<&'static str>,
        );
        let cases: &[Case] = &[
            // No networks configured: nothing is sent, and the message says what to set.
            (
                &[],
                false,
                "redfish://10.0.0.5",
                None,
                Some("--bmc-networks"),
            ),
            (&["any"], false, "redfish://203.0.113.9", None, None),
            (
                &["10.0.0.0/24"],
                false,
                "redfish://10.0.0.5/redfish/v1/Systems/1",
                None,
                None,
            ),
            (
                &["10.0.0.0/24"],
                false,
                "redfish://10.0.1.5",
                None,
                Some("outside"),
            ),
            (&["10.0.0.0/24"], false, "ipmi://10.0.0.5", None, None),
            (&["10.0.0.0/24"], false, "10.0.0.5:6230", None, None),
            (
                &["10.0.0.0/24"],
                false,
                "ipmi://10.9.0.5",
                None,
                Some("outside"),
            ),
            // An IPv4-mapped IPv6 address is its IPv4 address.
            (
                &["10.0.0.0/24"],
                false,
                "redfish://[::ffff:10.0.0.5]",
                None,
                None,
            ),
            (
                &["10.0.0.0/24"],
                false,
                "redfish://[::ffff:10.9.0.5]",
                None,
                Some("outside"),
            ),
            (&["fd00::/64"], false, "redfish://[fd00::5]", None, None),
            // A name is matched by name: an IP network does not admit names.
            (
                &["10.0.0.0/24"],
                false,
                "redfish://bmc1.example.com",
                None,
                Some("outside"),
            ),
            (
                &["bmc1.example.com"],
                false,
                "redfish://BMC1.example.com",
                None,
                None,
            ),
            (
                &["bmc1.example.com"],
                false,
                "redfish://bmc2.example.com",
                None,
                Some("outside"),
            ),
            (
                &[".bmc.example"],
                false,
                "redfish://r1.bmc.example",
                None,
                None,
            ),
            (
                &[".bmc.example"],
                false,
                "redfish://evilbmc.example",
                None,
                Some("outside"),
            ),
            (
                &[".bmc.example"],
                false,
                "redfish://bmc.example",
                None,
                Some("outside"),
            ),
            // Absolute (trailing-dot) names, in the address, the networks or the Secret's
            // list, are the names without the dot.
            (
                &[".oob"],
                false,
                "redfish://r12.oob./redfish/v1/Systems/1",
                None,
                None,
            ),
            (&[".oob."], false, "redfish://r12.oob", None, None),
            (&["r12.oob."], false, "ipmi://r12.oob.:6230", None, None),
            (&["r12.oob"], false, "r12.oob.", None, None),
            (&[".oob"], false, "redfish://oob.", None, Some("outside")),
            (
                &[".oob"],
                false,
                "redfish://r12.oob.evil.",
                None,
                Some("outside"),
            ),
            (
                &["any"],
                false,
                "redfish://r12.oob.",
                Some("R12.oob."),
                None,
            ),
            (
                &["any"],
                false,
                "ipmi://r12.oob:623",
                Some("r12.oob.:623"),
                None,
            ),
            (
                &["any"],
                false,
                "redfish://r12.oob.",
                Some("r13.oob."),
                Some("does not list"),
            ),
            // Plain HTTP only when allowed.
            (
                &["any"],
                false,
                "redfish+http://10.0.0.5:8000",
                None,
                Some("plain HTTP"),
            ),
            (&["any"], true, "redfish+http://10.0.0.5:8000", None, None),
            (&["any"], false, "ipmi://10.0.0.5", None, None),
            // The Secret's own list narrows the networks.
            (
                &["any"],
                false,
                "redfish://10.0.0.5",
                Some("10.0.0.5"),
                None,
            ),
            (
                &["any"],
                false,
                "redfish://10.0.0.5",
                Some("10.0.0.4, 10.0.0.5"),
                None,
            ),
            (
                &["any"],
                false,
                "redfish://10.0.0.5",
                Some("10.0.0.4\n10.0.0.6"),
                Some("does not list"),
            ),
            (
                &["any"],
                false,
                "redfish://10.0.0.5:8443",
                Some("10.0.0.5:443"),
                Some("does not list"),
            ),
            (
                &["any"],
                false,
                "redfish://10.0.0.5",
                Some("10.0.0.5:443"),
                None,
            ),
            (
                &["any"],
                false,
                "ipmi://10.0.0.5",
                Some("10.0.0.5:623"),
                None,
            ),
            (
                &["any"],
                false,
                "redfish://[fd00::5]:8443",
                Some("[fd00::5]:8443"),
                None,
            ),
            (
                &["any"],
                false,
                "redfish://[fd00::5]",
                Some("fd00::5"),
                None,
            ),
            (
                &["any"],
                false,
                "redfish://bmc1.example.com",
                Some("BMC1.example.com"),
                None,
            ),
            // The Secret cannot widen the operator's networks.
            (
                &["10.0.0.0/24"],
                false,
                "redfish://10.9.0.5",
                Some("10.9.0.5"),
                Some("outside"),
            ),
            // A broken list sends nothing.
            (
                &["any"],
                false,
                "redfish://10.0.0.5",
                Some(" , "),
                Some("lists no address"),
            ),
            (
                &["any"],
                false,
                "redfish://10.0.0.5",
                Some("10.0.0.5 http://x"),
                Some("cannot be read"),
            ),
            (
                &["any"],
                false,
                "redfish://10.0.0.5",
                Some("10.0.0.5:0"),
                Some("cannot be read"),
            ),
        ];
        for (networks, http, raw, annotation, expected) in cases {
            let result = destinations(networks, *http).check(&address(raw), *annotation);
            match (expected, result) {
                (None, Ok(())) => {}
                (Some(wanted), Err(e)) => {
                    assert!(e.to_string().contains(wanted), "{raw} {networks:?}: {e}")
                }
                (wanted, got) => {
                    panic!("{raw} {networks:?} {annotation:?}: wanted {wanted:?}, got {got:?}")
                }
            }
        }
    }

    /// A host's status is read by everyone who may read hosts: a refusal names the refused
    /// host and the flag, never the operator's networks (those go to the operator's log).
    #[test]
    fn refusals_name_the_host_and_the_flag_but_not_the_networks() {
        let configured = destinations(&["10.99.0.0/16", ".bmc.example", "bmc7.example.org"], false);
        for raw in [
            "redfish://10.0.1.5",
            "ipmi://r12.oob",
            "redfish://bmc8.example.org",
        ] {
            let refused = configured.check(&address(raw), None).unwrap_err();
            assert!(
                matches!(refused, DestinationRefused::OutsideNetworks { .. }),
                "{raw}: {refused:?}"
            );
            let text = refused.to_string();
            let host = raw.split("://").nth(1).unwrap();
            assert!(text.contains(host), "{raw}: {text}");
            assert!(text.contains("hostcycle operator --bmc-networks"), "{text}");
            for network in ["10.99.0.0/16", ".bmc.example", "bmc7.example.org"] {
                assert!(!text.contains(network), "{raw}: lists {network}: {text}");
            }
        }
        assert_eq!(
            configured.networks_text(),
            "10.99.0.0/16,.bmc.example,bmc7.example.org"
        );
        // None configured is an install mistake, not a secret: the message says so.
        let text = destinations(&[], false)
            .check(&address("redfish://10.0.0.5"), None)
            .unwrap_err()
            .to_string();
        assert!(text.contains("none are configured"), "{text}");
        assert!(text.contains("--bmc-networks"), "{text}");
    }

    #[test]
    fn a_huge_annotation_is_refused_and_never_echoed() {
        let huge = "10.0.0.5,".repeat(4096);
        let err = destinations(&["any"], false)
            .check(&address("redfish://10.0.0.5"), Some(&huge))
            .unwrap_err();
        assert!(err.to_string().contains("longer than"), "{err}");
        assert!(err.to_string().len() < 400, "{err}");
    }
}
