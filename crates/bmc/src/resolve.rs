//! Turning a BMC's DNS name into the addresses a driver connects to, once, checked.
//!
//! A Kubernetes pod resolves with its namespace's search list and `ndots:5`: `r12.oob` would
//! first be tried as `r12.oob.<ns>.svc.cluster.local`, … `r12.oob.svc.cluster.local` — a
//! Service `r12` in a namespace `oob`, which whoever may create that namespace controls. So
//! under a restricted `--bmc-networks` ([`NameResolution::Absolute`]) the drivers resolve a
//! name themselves, as an absolute name:
//!
//! 1. the hosts file (`/etc/hosts`, where a pod's `hostAliases` land; only the pod's spec
//!    writes it), by the name without its final dot;
//! 2. else DNS, for the name with a final dot (`r12.oob.`): glibc and musl never complete
//!    such a name with the search list.
//!
//! Every address found must then be inside the CIDR networks ([`NameResolution::check_resolved`]),
//! and the driver connects to exactly those addresses: the Redfish client through
//! [`CheckedResolver`] (reqwest calls it for each new connection, the URL keeps the name for
//! TLS and `Host`), `ipmitool` with the checked IP as `-H`. No second lookup happens between
//! the check and the connection.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::destination::{BmcNetwork, DestinationRefused, NameResolution, networks_text};

/// The hosts file read before DNS.
pub const HOSTS_FILE: &str = "/etc/hosts";

/// Largest hosts file read; a larger one is not a hosts file a pod spec wrote.
const MAX_HOSTS_FILE_BYTES: u64 = 1024 * 1024;

/// How often one refusal is logged again while it lasts.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(600);

/// Refusals remembered for [`REFUSAL_LOG_INTERVAL`]; beyond this many the memory starts over.
const MAX_REMEMBERED_REFUSALS: usize = 4096;

/// Why a name gave no address to connect to.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ResolveError {
    /// An address outside the networks (or no networks at all): permanent until DNS or the
    /// flag changes.
    #[error(transparent)]
    Refused(#[from] DestinationRefused),
    /// The lookup failed or found nothing: may pass (DNS outage).
    #[error("cannot resolve {name}{how}: {detail}")]
    Lookup {
        name: String,
        /// ` (as an absolute name)` or empty.
        how: &'static str,
        detail: String,
    },
}

/// Resolves BMC names under one [`NameResolution`] rule. Cheap to clone; shared by every
/// driver of a connector.
#[derive(Debug, Clone)]
pub struct BmcResolver {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    rule: NameResolution,
    /// The networks as configured, for the log line of a refusal.
    networks_text: String,
    hosts_file: PathBuf,
    logged: Mutex<HashMap<String, Instant>>,
}

impl BmcResolver {
    /// The resolver for the operator's `--bmc-networks`.
    pub fn new(networks: &[BmcNetwork]) -> Self {
        Self::with_hosts_file(networks, PathBuf::from(HOSTS_FILE))
    }

    /// [`BmcResolver::new`] reading another hosts file (tests).
    pub fn with_hosts_file(networks: &[BmcNetwork], hosts_file: PathBuf) -> Self {
        BmcResolver {
            inner: Arc::new(Inner {
                rule: NameResolution::for_networks(networks),
                networks_text: networks_text(networks),
                hosts_file,
                logged: Mutex::default(),
            }),
        }
    }

    pub fn rule(&self) -> &NameResolution {
        &self.inner.rule
    }

    /// The checked addresses of `name` (a DNS name, no IP literal), with `port`.
    pub async fn resolve(&self, name: &str, port: u16) -> Result<Vec<SocketAddr>, ResolveError> {
        let name = crate::destination::without_final_dot(name).to_ascii_lowercase();
        let addresses = if self.inner.rule.absolute() {
            match self.hosts_file_lookup(&name).await {
                Some(found) => found,
                None => lookup(&format!("{name}."), " (as an absolute name)", &name).await?,
            }
        } else {
            lookup(&name, "", &name).await?
        };
        if let Err(refused) = self.inner.rule.check_resolved(&name, &addresses) {
            self.log_refusal(&name, &addresses, &refused);
            return Err(refused.into());
        }
        Ok(addresses
            .into_iter()
            .map(|ip| SocketAddr::new(ip, port))
            .collect())
    }

    /// The hosts file's addresses for `name`; `None` when it lists none or cannot be read
    /// (a pod always has one; without it, DNS answers).
    async fn hosts_file_lookup(&self, name: &str) -> Option<Vec<IpAddr>> {
        let file = tokio::fs::File::open(&self.inner.hosts_file).await.ok()?;
        let mut text = String::new();
        use tokio::io::AsyncReadExt;
        file.take(MAX_HOSTS_FILE_BYTES)
            .read_to_string(&mut text)
            .await
            .ok()?;
        let found = hosts_file_addresses(&text, name);
        (!found.is_empty()).then_some(found)
    }

    /// One warning per refusal and name every [`REFUSAL_LOG_INTERVAL`], with what the host's
    /// status leaves out: every address found and the configured networks.
    fn log_refusal(&self, name: &str, addresses: &[IpAddr], refused: &DestinationRefused) {
        let key = format!("{name} {addresses:?}");
        let now = Instant::now();
        {
            let mut logged = match self.inner.logged.lock() {
                Ok(logged) => logged,
                Err(poisoned) => poisoned.into_inner(),
            };
            if logged
                .get(&key)
                .is_some_and(|at| now.duration_since(*at) < REFUSAL_LOG_INTERVAL)
            {
                return;
            }
            if logged.len() >= MAX_REMEMBERED_REFUSALS {
                logged.clear();
            }
            logged.insert(key, now);
        }
        tracing::warn!(
            bmc = %name,
            resolved = ?addresses,
            bmc_networks = %self.inner.networks_text,
            refusal = %refused,
            "BMC credentials refused: the BMC's name resolves outside --bmc-networks"
        );
    }
}

/// `name` looked up by the system resolver (`getaddrinfo`), addresses in its order without
/// repeats.
async fn lookup(query: &str, how: &'static str, name: &str) -> Result<Vec<IpAddr>, ResolveError> {
    let failed = |detail: String| ResolveError::Lookup {
        name: name.to_string(),
        how,
        detail,
    };
    let found = tokio::net::lookup_host((query, 0))
        .await
        .map_err(|e| failed(e.to_string()))?;
    let mut addresses: Vec<IpAddr> = Vec::new();
    for address in found {
        if !addresses.contains(&address.ip()) {
            addresses.push(address.ip());
        }
    }
    if addresses.is_empty() {
        return Err(failed("no address".into()));
    }
    Ok(addresses)
}

/// The addresses a hosts file gives `name` (lower case, no final dot), in file order.
/// Lines are `IP name [alias…]`, `#` starts a comment; names compare without case and
/// without a final dot. Lines whose first field is not an IP (zone-scoped IPv6, garbage)
/// are skipped.
pub fn hosts_file_addresses(text: &str, name: &str) -> Vec<IpAddr> {
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut fields = line.split_whitespace();
        let Some(Ok(ip)) = fields.next().map(str::parse::<IpAddr>) else {
            continue;
        };
        let listed = fields
            .any(|field| crate::destination::without_final_dot(field).eq_ignore_ascii_case(name));
        if listed && !found.contains(&ip) {
            found.push(ip);
        }
    }
    found
}

/// The Redfish client's resolver: [`BmcResolver::resolve`] for each new connection.
#[derive(Debug, Clone)]
pub(crate) struct CheckedResolver(pub(crate) BmcResolver);

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let resolver = self.0.clone();
        let name = name.as_str().to_string();
        Box::pin(async move {
            // Port 0: reqwest puts the URL's port in.
            let addresses = resolver.resolve(&name, 0).await?;
            let addresses: reqwest::dns::Addrs = Box::new(addresses.into_iter());
            Ok(addresses)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn networks(list: &[&str]) -> Vec<BmcNetwork> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    #[test]
    fn hosts_file_lines() {
        let text = "127.0.0.1 localhost\n\
                    ::1 localhost ip6-localhost # loopback\n\
                    # 10.0.0.9 r12.oob\n\
                    10.0.0.12\tR12.OOB.  r12\n\
                    fe80::1%eth0 r12.oob\n\
                    not-an-ip r12.oob\n\
                    10.0.0.13 r12.oob\n\
                    10.0.0.12 r12.oob\n";
        assert_eq!(
            hosts_file_addresses(text, "localhost"),
            ips(&["127.0.0.1", "::1"])
        );
        assert_eq!(
            hosts_file_addresses(text, "r12.oob"),
            ips(&["10.0.0.12", "10.0.0.13"])
        );
        assert_eq!(hosts_file_addresses(text, "r12"), ips(&["10.0.0.12"]));
        assert!(hosts_file_addresses(text, "oob").is_empty());
        assert!(hosts_file_addresses(text, "ip6").is_empty());
    }

    /// (networks, resolved addresses, expected refusal or None)
    #[test]
    fn resolved_addresses_must_all_be_inside_the_cidr_networks() {
        type Case = (
            &'static [&'static str],
            &'static [&'static str],
            Option<&'static str>,
        );
        let cases: &[Case] = &[
            // CIDRs configured: every address inside one of them.
            (&[".oob", "10.0.0.0/24"], &["10.0.0.12"], None),
            (
                &[".oob", "10.0.0.0/24", "fd00::/64"],
                &["10.0.0.12", "fd00::12"],
                None,
            ),
            (&[".oob", "10.0.0.12"], &["10.0.0.12"], None),
            (
                &[".oob", "10.0.0.0/24"],
                &["10.96.4.7"],
                Some("resolves to 10.96.4.7"),
            ),
            // One address outside is enough to refuse: the connection may fall back to it.
            (
                &[".oob", "10.0.0.0/24"],
                &["10.0.0.12", "10.96.4.7"],
                Some("resolves to 10.96.4.7"),
            ),
            (
                &[".oob", "10.0.0.0/24"],
                &["fd00::12"],
                Some("resolves to fd00::12"),
            ),
            // An IPv4-mapped IPv6 answer is its IPv4 address.
            (&[".oob", "10.0.0.0/24"], &["::ffff:10.0.0.12"], None),
            (
                &[".oob", "10.0.0.0/24"],
                &["::ffff:10.96.4.7"],
                Some("resolves to 10.96.4.7"),
            ),
            // Names and suffixes only: their DNS is trusted, addresses are not checked.
            (&[".oob"], &["10.96.4.7"], None),
            (&["r12.oob"], &["192.0.2.1"], None),
            // `any`: nothing is checked.
            (&["any", "10.0.0.0/24"], &["192.0.2.1"], None),
            // Nothing configured: nothing resolves.
            (&[], &["10.0.0.12"], Some("none are configured")),
        ];
        for (configured, resolved, expected) in cases {
            let rule = NameResolution::for_networks(&networks(configured));
            let result = rule.check_resolved("r12.oob", &ips(resolved));
            match (expected, result) {
                (None, Ok(())) => {}
                (Some(wanted), Err(refused)) => {
                    let text = refused.to_string();
                    assert!(text.contains(wanted), "{configured:?} {resolved:?}: {text}");
                    assert!(text.contains("r12.oob"), "names the host: {text}");
                    assert!(text.contains("--bmc-networks"), "names the flag: {text}");
                    for network in configured.iter().filter(|n| n.contains('/')) {
                        assert!(!text.contains(network), "no networks listed: {text}");
                    }
                }
                (wanted, got) => {
                    panic!("{configured:?} {resolved:?}: wanted {wanted:?}, got {got:?}")
                }
            }
        }
    }

    #[test]
    fn names_are_resolved_as_absolute_names_unless_any_is_configured() {
        assert!(NameResolution::for_networks(&networks(&[".oob"])).absolute());
        assert!(NameResolution::for_networks(&networks(&["10.0.0.0/8"])).absolute());
        assert!(NameResolution::for_networks(&[]).absolute());
        assert!(!NameResolution::for_networks(&networks(&["any"])).absolute());
    }

    /// The hosts file answers first, by the name without its final dot; the check applies
    /// to what it gives.
    #[tokio::test]
    async fn the_hosts_file_answers_and_its_addresses_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, "10.0.0.12 r12.oob\n10.96.4.7 evil.oob\n").unwrap();
        let resolver =
            BmcResolver::with_hosts_file(&networks(&[".oob", "10.0.0.0/24"]), hosts.clone());
        let found = resolver.resolve("R12.oob.", 623).await.unwrap();
        assert_eq!(found, vec!["10.0.0.12:623".parse().unwrap()]);
        let refused = resolver.resolve("evil.oob", 623).await.unwrap_err();
        assert!(
            matches!(
                refused,
                ResolveError::Refused(DestinationRefused::ResolvesOutsideNetworks { .. })
            ),
            "{refused}"
        );
        let text = refused.to_string();
        assert!(!text.contains("10.0.0.0/24"), "{text}");
    }
}
