//! What `rq add` was given, and which Nodes it names. Pure: the tokens of a file's text,
//! and each token matched against a list of Nodes by name or by address.
//!
//! CKE's reboot queue holds node *addresses* (`ckecli reboot-queue add FILE` reads IPs);
//! hostcycle's entries hold Node names. A token is a Node's name, or an address that one
//! Node's `status.addresses` carries (InternalIP, ExternalIP or Hostname; IPs compared in
//! canonical form, so `fd00::0:1` is `fd00::1` and `::ffff:10.0.0.1` is `10.0.0.1`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;

/// Most bytes read from one file (or stdin): a node list is far smaller.
pub const MAX_INPUT_BYTES: u64 = 1024 * 1024;
/// Most tokens one `add` takes, from arguments and files together.
pub const MAX_TOKENS: usize = 10_000;

/// The address types a token is matched against (the kubelet's; `InternalDNS` and
/// `ExternalDNS` are names a DNS server may hand to several machines).
const MATCHED_ADDRESS_TYPES: [&str; 3] = ["InternalIP", "ExternalIP", "Hostname"];

/// Tokens of a node list: separated by any whitespace (spaces, tabs, newlines), as CKE
/// reads them; `#` starts a comment to the end of the line. `node/NAME` (what `kubectl get
/// nodes -o name` prints) is `NAME`.
pub fn parse_tokens(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or_default())
        .flat_map(str::split_whitespace)
        .map(normalize)
        .filter(|token| !token.is_empty())
        .collect()
}

/// `node/NAME` and `nodes/NAME` are `NAME`.
pub fn normalize(token: &str) -> String {
    let token = token.trim();
    token
        .strip_prefix("node/")
        .or_else(|| token.strip_prefix("nodes/"))
        .unwrap_or(token)
        .to_string()
}

/// An IP literal, bare or in brackets (`[fd00::1]`), in canonical form.
pub fn parse_ip(text: &str) -> Option<IpAddr> {
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    bare.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// What a Node offers for matching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    /// `(type, address)` pairs from `status.addresses`.
    pub addresses: Vec<(String, String)>,
}

impl NodeFacts {
    pub fn from_node(node: &Node) -> Self {
        NodeFacts {
            name: node.metadata.name.clone().unwrap_or_default(),
            addresses: node
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .map(|addresses| {
                    addresses
                        .iter()
                        .map(|a| (a.type_.clone(), a.address.clone()))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// Which Nodes one token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match {
    /// Exactly one Node; `via` is the address that matched (`InternalIP 10.0.0.1`), `None`
    /// when the token is the Node's name.
    Node { name: String, via: Option<String> },
    /// No Node. `address`: the token is an IP literal (else it is taken for a name).
    NotFound { address: bool },
    /// Several Nodes, each with what matched (`worker-1 (InternalIP 10.0.0.1)`).
    Ambiguous(Vec<String>),
}

/// Matches one (normalized) token: the Node with that name, and every Node with an address
/// equal to it; one Node in all is a match, several are ambiguous.
pub fn match_token(token: &str, nodes: &[NodeFacts]) -> Match {
    let ip = parse_ip(token);
    let hostname = token.trim_end_matches('.');
    // Node name → what matched (the name first, then addresses in the Node's order).
    let mut candidates: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for node in nodes {
        if node.name == token {
            candidates
                .entry(&node.name)
                .or_default()
                .push("name".into());
        }
        for (kind, address) in &node.addresses {
            if !MATCHED_ADDRESS_TYPES.contains(&kind.as_str()) {
                continue;
            }
            let same = match ip {
                Some(ip) => parse_ip(address.trim()) == Some(ip),
                None => {
                    !hostname.is_empty()
                        && address
                            .trim()
                            .trim_end_matches('.')
                            .eq_ignore_ascii_case(hostname)
                }
            };
            if same {
                candidates
                    .entry(&node.name)
                    .or_default()
                    .push(format!("{kind} {address}"));
            }
        }
    }
    match candidates.len() {
        0 => Match::NotFound {
            address: ip.is_some(),
        },
        1 => {
            let (name, how) = candidates.into_iter().next().unwrap_or_default();
            let via = if how.iter().any(|h| h == "name") {
                None
            } else {
                how.into_iter().next()
            };
            Match::Node {
                name: name.to_string(),
                via,
            }
        }
        _ => Match::Ambiguous(
            candidates
                .into_iter()
                .map(|(name, how)| format!("{name} ({})", how.join(", ")))
                .collect(),
        ),
    }
}

/// A token and where it came from (`nodes.txt`, `stdin`; `None` for an argument).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub text: String,
    pub origin: Option<String>,
}

impl Token {
    fn describe(&self) -> String {
        match &self.origin {
            Some(origin) => format!("{} (from {origin})", self.text),
            None => self.text.clone(),
        }
    }
}

/// The Nodes an `add` names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resolution {
    /// Node names to queue, in the order given, each once.
    pub nodes: Vec<String>,
    /// Notes for stderr: which Node an address is, and tokens naming a Node again.
    pub notes: Vec<String>,
    /// Tokens that are no Node's name (reported; the others are still queued).
    pub unknown_names: Vec<String>,
}

/// Resolves every token against `nodes`. An address that names no Node or several, or a
/// name that several Nodes answer to, refuses the whole `add`: each problem is returned and
/// nothing may be queued. A name no Node has is only reported (as `add NODE…` always did).
pub fn resolve(tokens: &[Token], nodes: &[NodeFacts]) -> Result<Resolution, Vec<String>> {
    let mut resolution = Resolution::default();
    let mut problems = Vec::new();
    // Node → the first token that named it.
    let mut named_by: BTreeMap<String, String> = BTreeMap::new();
    for token in tokens {
        match match_token(&token.text, nodes) {
            Match::Node { name, via } => {
                if let Some(via) = &via {
                    resolution
                        .notes
                        .push(format!("{} is Node {name} ({via})", token.describe()));
                }
                if let Some(first) = named_by.get(&name) {
                    resolution.notes.push(format!(
                        "{} names Node {name} again (first as {first}); it is queued once",
                        token.describe()
                    ));
                } else {
                    named_by.insert(name.clone(), token.text.clone());
                    resolution.nodes.push(name);
                }
            }
            Match::NotFound { address: true } => problems.push(format!(
                "address {} is no Node's InternalIP, ExternalIP or Hostname (see `kubectl get \
                 nodes -o wide`)",
                token.describe()
            )),
            Match::NotFound { address: false } => {
                let name = token.describe();
                if !resolution.unknown_names.contains(&name) {
                    resolution.unknown_names.push(name);
                }
            }
            Match::Ambiguous(candidates) => problems.push(format!(
                "{} matches {} Nodes: {}; name the Node instead",
                token.describe(),
                candidates.len(),
                candidates.join(", ")
            )),
        }
    }
    if problems.is_empty() {
        Ok(resolution)
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn node(name: &str, addresses: &[(&str, &str)]) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            addresses: addresses
                .iter()
                .map(|(k, a)| (k.to_string(), a.to_string()))
                .collect(),
        }
    }

    fn arg(text: &str) -> Token {
        Token {
            text: text.into(),
            origin: None,
        }
    }

    fn cluster() -> Vec<NodeFacts> {
        vec![
            node(
                "worker-1",
                &[
                    ("InternalIP", "10.0.0.1"),
                    ("ExternalIP", "203.0.113.1"),
                    ("Hostname", "worker-1"),
                ],
            ),
            node(
                "worker-2",
                &[("InternalIP", "fd00::2"), ("Hostname", "w2.example.")],
            ),
            // Shares 10.0.0.7 with worker-4 (a copied Node, a reused address).
            node("worker-3", &[("InternalIP", "10.0.0.7")]),
            node(
                "worker-4",
                &[("InternalIP", "10.0.0.7"), ("InternalDNS", "10.0.0.4")],
            ),
            // A Node named by its address, as CKE names Nodes without a hostname.
            node("10.0.0.5", &[("InternalIP", "10.0.0.5")]),
        ]
    }

    #[test]
    fn tokens_are_split_on_any_whitespace_with_comments() {
        let text = "# rack 3\n\nworker-1 worker-2\tworker-3\r\n  10.0.0.4   # the noisy one\n\
                    node/worker-5\n#worker-6\n\t\n";
        assert_eq!(
            parse_tokens(text),
            ["worker-1", "worker-2", "worker-3", "10.0.0.4", "worker-5"]
        );
        assert_eq!(parse_tokens("worker-1 worker-2"), ["worker-1", "worker-2"]);
        assert!(parse_tokens("").is_empty());
        assert!(parse_tokens("# only a comment\n\n \t").is_empty());
    }

    #[test]
    fn ips_are_compared_in_canonical_form() {
        assert_eq!(parse_ip("fd00::0:2"), parse_ip("fd00::2"));
        assert_eq!(parse_ip("[fd00::2]"), parse_ip("fd00::2"));
        assert_eq!(parse_ip("::ffff:10.0.0.1"), parse_ip("10.0.0.1"));
        assert_eq!(parse_ip("worker-1"), None);
        assert_eq!(parse_ip("10.0.0.256"), None);
    }

    #[test]
    fn a_token_is_a_name_or_one_nodes_address() {
        let nodes = cluster();
        let m = |t: &str| match_token(t, &nodes);
        let node = |name: &str, via: Option<&str>| Match::Node {
            name: name.into(),
            via: via.map(str::to_string),
        };
        assert_eq!(m("worker-1"), node("worker-1", None), "name (and Hostname)");
        assert_eq!(m("10.0.0.1"), node("worker-1", Some("InternalIP 10.0.0.1")));
        assert_eq!(
            m("203.0.113.1"),
            node("worker-1", Some("ExternalIP 203.0.113.1"))
        );
        assert_eq!(m("fd00:0::2"), node("worker-2", Some("InternalIP fd00::2")));
        assert_eq!(m("[fd00::2]"), node("worker-2", Some("InternalIP fd00::2")));
        assert_eq!(
            m("W2.example"),
            node("worker-2", Some("Hostname w2.example."))
        );
        assert_eq!(
            m("10.0.0.5"),
            node("10.0.0.5", None),
            "named by its address"
        );
        assert_eq!(m("nope"), Match::NotFound { address: false });
        assert_eq!(m("10.9.9.9"), Match::NotFound { address: true });
        // InternalDNS is not matched: DNS names may be shared.
        assert_eq!(m("10.0.0.4"), Match::NotFound { address: true });
        assert_eq!(
            m("10.0.0.7"),
            Match::Ambiguous(vec![
                "worker-3 (InternalIP 10.0.0.7)".into(),
                "worker-4 (InternalIP 10.0.0.7)".into(),
            ])
        );
    }

    #[test]
    fn a_name_that_is_another_nodes_address_is_ambiguous() {
        let nodes = vec![
            node("worker-1", &[("Hostname", "worker-1")]),
            node("worker-9", &[("Hostname", "worker-1")]),
        ];
        assert_eq!(
            match_token("worker-1", &nodes),
            Match::Ambiguous(vec![
                "worker-1 (name, Hostname worker-1)".into(),
                "worker-9 (Hostname worker-1)".into(),
            ])
        );
    }

    #[test]
    fn names_and_addresses_resolve_in_order_each_node_once() {
        let nodes = cluster();
        let tokens = [
            arg("10.0.0.1"),
            Token {
                text: "worker-2".into(),
                origin: Some("stdin".into()),
            },
            arg("worker-1"),
            arg("nope"),
        ];
        let r = resolve(&tokens, &nodes).unwrap();
        assert_eq!(r.nodes, ["worker-1", "worker-2"]);
        assert_eq!(r.unknown_names, ["nope"]);
        assert_eq!(
            r.notes,
            [
                "10.0.0.1 is Node worker-1 (InternalIP 10.0.0.1)",
                "worker-1 names Node worker-1 again (first as 10.0.0.1); it is queued once",
            ]
        );
    }

    #[test]
    fn an_unknown_or_ambiguous_address_refuses_everything() {
        let nodes = cluster();
        let problems = resolve(
            &[
                arg("worker-1"),
                Token {
                    text: "10.0.0.7".into(),
                    origin: Some("nodes.txt".into()),
                },
                arg("10.9.9.9"),
            ],
            &nodes,
        )
        .unwrap_err();
        assert_eq!(
            problems,
            [
                "10.0.0.7 (from nodes.txt) matches 2 Nodes: worker-3 (InternalIP 10.0.0.7), \
                 worker-4 (InternalIP 10.0.0.7); name the Node instead",
                "address 10.9.9.9 is no Node's InternalIP, ExternalIP or Hostname (see \
                 `kubectl get nodes -o wide`)",
            ]
        );
    }
}
