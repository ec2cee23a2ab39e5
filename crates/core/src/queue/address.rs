//! The node address the reboot and boot-check commands get as an argument.
//!
//! It comes from the Node's status, which the node's kubelet writes: a compromised node can
//! put anything there. ssh-like tools read an argument starting with `-` as an option
//! (`-oProxyCommand=…` runs a command on the operator's side), and scripts may pass it on to
//! a shell. So an address is passed only when it is an IP literal (v4 or v6) or a DNS-1123
//! subdomain name — the forms a kubelet writes for InternalIP, ExternalIP and Hostname, and
//! the form of every Node name. Anything else is refused: the commands are not run.
//!
//! A kubelet may also report *another* node's address as its own: the commands would then
//! reboot (and boot-check) that node, undrained. So an address is passed only when no other
//! Node reports it ([`node_sharing_address`]); otherwise the entry waits.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use super::snapshot::QueueNodeView;

/// Longest DNS-1123 subdomain name.
pub const MAX_NAME_BYTES: usize = 253;
/// Longest label of a DNS-1123 name.
pub const MAX_LABEL_BYTES: usize = 63;
/// Longest part of a refused address quoted in a message (a kubelet may write megabytes).
pub const SHOWN_ADDRESS_CHARS: usize = 64;

/// Why an address is not passed to a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnsafeAddress {
    Empty,
    /// Starts with `-`: a command would read it as an option.
    OptionLike,
    TooLong {
        bytes: usize,
    },
    /// A character that is neither a lowercase letter, a digit, `-` nor `.`.
    Character {
        character: char,
    },
    EmptyLabel,
    LongLabel {
        bytes: usize,
    },
    /// A label starts or ends with `-`.
    HyphenAtLabelEdge,
}

impl fmt::Display for UnsafeAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("it is empty"),
            Self::OptionLike => f.write_str("it starts with '-' (a command reads it as an option)"),
            Self::TooLong { bytes } => {
                write!(f, "it is {bytes} bytes long, more than {MAX_NAME_BYTES}")
            }
            Self::Character { character } => write!(
                f,
                "it holds {character:?}, which is neither a lowercase letter, a digit, '-' nor '.'"
            ),
            Self::EmptyLabel => f.write_str("it has an empty label (two dots, or a dot at an end)"),
            Self::LongLabel { bytes } => {
                write!(
                    f,
                    "a label is {bytes} bytes long, more than {MAX_LABEL_BYTES}"
                )
            }
            Self::HyphenAtLabelEdge => f.write_str("a label starts or ends with '-'"),
        }
    }
}

/// `Ok` when `address` may be passed to a command: an IP literal, or a DNS-1123 subdomain
/// name (lowercase letters, digits, `-` and `.`; labels of 1 to 63 bytes not starting or
/// ending with `-`; at most 253 bytes in all).
pub fn check_command_address(address: &str) -> Result<(), UnsafeAddress> {
    if address.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    if address.is_empty() {
        return Err(UnsafeAddress::Empty);
    }
    // Named first: it is the attack this check exists for.
    if address.starts_with('-') {
        return Err(UnsafeAddress::OptionLike);
    }
    if address.len() > MAX_NAME_BYTES {
        return Err(UnsafeAddress::TooLong {
            bytes: address.len(),
        });
    }
    if let Some(character) = address
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
    {
        return Err(UnsafeAddress::Character { character });
    }
    for label in address.split('.') {
        if label.is_empty() {
            return Err(UnsafeAddress::EmptyLabel);
        }
        if label.len() > MAX_LABEL_BYTES {
            return Err(UnsafeAddress::LongLabel { bytes: label.len() });
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(UnsafeAddress::HyphenAtLabelEdge);
        }
    }
    Ok(())
}

/// `address` fit for a message: quoted and escaped (control characters, quotes), at most
/// [`SHOWN_ADDRESS_CHARS`] characters of it, marked when cut.
pub fn shown_address(address: &str) -> String {
    let count = address.chars().count();
    let head: String = address.chars().take(SHOWN_ADDRESS_CHARS).collect();
    if count > SHOWN_ADDRESS_CHARS {
        format!("{head:?}… ({count} characters)")
    } else {
        format!("{head:?}")
    }
}

/// Why node `node`'s commands are not run with `address`, for the entry's status and a
/// Warning Event; `None` when the address is safe.
pub fn unsafe_address_refusal(node: &str, address: &str) -> Option<String> {
    let why = check_command_address(address).err()?;
    Some(format!(
        "node {node} cannot be rebooted by command: its address {} (from the Node's status) \
         is not an IP address or a DNS name: {why}; the reboot and boot-check commands are \
         not run with it. Fix the Node's addresses (they come from its kubelet: a node \
         writing such a value may be compromised)",
        shown_address(address)
    ))
}

/// An IP literal, bare or in brackets (`[fd00::1]`), in canonical form (`fd00::0:1` is
/// `fd00::1`, `::ffff:10.0.0.1` is `10.0.0.1`).
fn canonical_ip(text: &str) -> Option<IpAddr> {
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    bare.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// Whether two node addresses are the same: IPs compared in canonical form (as `rq add`
/// compares them), names without regard to case or a trailing dot.
pub fn same_address(a: &str, b: &str) -> bool {
    match (AddressKey::of(a), AddressKey::of(b)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// An address as compared: an IP in canonical form, or a name in lowercase without a trailing
/// dot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum AddressKey {
    Ip(IpAddr),
    Name(String),
}

impl AddressKey {
    /// `None` for a blank address (it names nothing).
    fn of(address: &str) -> Option<AddressKey> {
        let address = address.trim();
        if let Some(ip) = canonical_ip(address) {
            return Some(AddressKey::Ip(ip));
        }
        let name = address.trim_end_matches('.');
        (!name.is_empty()).then(|| AddressKey::Name(name.to_ascii_lowercase()))
    }
}

/// Which Nodes report each address — their InternalIP, ExternalIP and Hostname addresses and
/// their own command address (their name, when they report none) — built once for a whole
/// plan.
#[derive(Debug, Default)]
pub struct AddressOwners<'a> {
    by_address: BTreeMap<AddressKey, BTreeSet<&'a str>>,
}

impl<'a> AddressOwners<'a> {
    pub fn new(nodes: impl IntoIterator<Item = &'a QueueNodeView>) -> Self {
        let mut by_address: BTreeMap<AddressKey, BTreeSet<&'a str>> = BTreeMap::new();
        for node in nodes {
            let addresses = std::iter::once(&node.address).chain(node.reported_addresses.iter());
            for key in addresses.filter_map(|a| AddressKey::of(a)) {
                by_address
                    .entry(key)
                    .or_default()
                    .insert(node.name.as_str());
            }
        }
        AddressOwners { by_address }
    }

    /// The first node (by name) other than `node` that reports `address` too.
    pub fn other_than(&self, node: &str, address: &str) -> Option<&'a str> {
        let owners = self.by_address.get(&AddressKey::of(address)?)?;
        owners.iter().copied().find(|owner| *owner != node)
    }
}

/// The first node (by name) other than `node` among `nodes` that reports `address`, node
/// `node`'s command address, too ([`AddressOwners`]).
pub fn node_sharing_address<'a>(
    node: &str,
    address: &str,
    nodes: impl IntoIterator<Item = &'a QueueNodeView>,
) -> Option<&'a str> {
    AddressOwners::new(nodes).other_than(node, address)
}

/// Why node `node`'s commands are not run with `address` because another of `nodes` reports it
/// too, for the entry's status and a Warning Event; `None` when no other node does.
pub fn ambiguous_address_refusal<'a>(
    node: &str,
    address: &str,
    nodes: impl IntoIterator<Item = &'a QueueNodeView>,
) -> Option<String> {
    let other = node_sharing_address(node, address, nodes)?;
    Some(format!(
        "node {node} cannot be rebooted by command: its address {} (from the Node's status) \
         is also an address of node {other}; the reboot and boot-check commands are not run \
         with it, as they could reach node {other}. Fix the Nodes' addresses (they come from \
         their kubelets: a node reporting another node's address may be compromised)",
        shown_address(address)
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn addresses_table() {
        let long_name = format!("{}.example", "a".repeat(300));
        let long_label = format!("{}.example", "a".repeat(64));
        let ok_label = format!("{}.example", "a".repeat(63));
        let label = "a".repeat(63);
        let longest = [label.as_str(), &label, &label, &"b".repeat(61)].join(".");
        let cases: &[(&str, Result<(), UnsafeAddress>)] = &[
            ("10.0.0.1", Ok(())),
            ("192.0.2.10", Ok(())),
            ("fd00::1", Ok(())),
            ("::1", Ok(())),
            ("::ffff:10.0.0.1", Ok(())),
            ("2001:db8::8a2e:370:7334", Ok(())),
            ("node-1.example", Ok(())),
            ("node-1", Ok(())),
            ("n", Ok(())),
            ("0node", Ok(())),
            (&ok_label, Ok(())),
            ("-oProxyCommand=x", Err(UnsafeAddress::OptionLike)),
            ("-", Err(UnsafeAddress::OptionLike)),
            ("--", Err(UnsafeAddress::OptionLike)),
            ("-node", Err(UnsafeAddress::OptionLike)),
            ("a b", Err(UnsafeAddress::Character { character: ' ' })),
            ("`x`", Err(UnsafeAddress::Character { character: '`' })),
            ("$(x)", Err(UnsafeAddress::Character { character: '$' })),
            ("a;b", Err(UnsafeAddress::Character { character: ';' })),
            ("a|b", Err(UnsafeAddress::Character { character: '|' })),
            ("a\nb", Err(UnsafeAddress::Character { character: '\n' })),
            ("a\0b", Err(UnsafeAddress::Character { character: '\0' })),
            ("Node-1", Err(UnsafeAddress::Character { character: 'N' })),
            ("node_1", Err(UnsafeAddress::Character { character: '_' })),
            (
                "fe80::1%eth0",
                Err(UnsafeAddress::Character { character: ':' }),
            ),
            (
                "[fd00::1]",
                Err(UnsafeAddress::Character { character: '[' }),
            ),
            (
                "user@node",
                Err(UnsafeAddress::Character { character: '@' }),
            ),
            ("nöde", Err(UnsafeAddress::Character { character: 'ö' })),
            ("", Err(UnsafeAddress::Empty)),
            ("a..b", Err(UnsafeAddress::EmptyLabel)),
            (".a", Err(UnsafeAddress::EmptyLabel)),
            ("a.", Err(UnsafeAddress::EmptyLabel)),
            ("a.-b", Err(UnsafeAddress::HyphenAtLabelEdge)),
            ("a-.b", Err(UnsafeAddress::HyphenAtLabelEdge)),
            (&long_label, Err(UnsafeAddress::LongLabel { bytes: 64 })),
            (&long_name, Err(UnsafeAddress::TooLong { bytes: 308 })),
        ];
        for (address, expected) in cases {
            assert_eq!(&check_command_address(address), expected, "{address:?}");
        }
        assert_eq!(longest.len(), MAX_NAME_BYTES);
        assert_eq!(check_command_address(&longest), Ok(()));
        assert!(check_command_address(&format!("{longest}b")).is_err());
    }

    /// Addresses compare as `rq add` compares them: IPs in canonical form, names without
    /// case or a trailing dot; an IP never equals a name.
    #[test]
    fn same_address_table() {
        let cases: &[(&str, &str, bool)] = &[
            ("10.0.0.1", "10.0.0.1", true),
            ("10.0.0.1", " 10.0.0.1\n", true),
            ("::ffff:10.0.0.1", "10.0.0.1", true),
            ("fd00::0:1", "fd00::1", true),
            ("[fd00::1]", "fd00::1", true),
            ("FD00::1", "fd00::1", true),
            ("10.0.0.1", "10.0.0.10", false),
            ("fd00::1", "fd00::2", false),
            ("node-1.example", "Node-1.Example.", true),
            ("node-1", "node-1.example", false),
            ("10.0.0.1", "node-1", false),
            ("", "", false),
            (".", "", false),
        ];
        for (a, b, same) in cases {
            assert_eq!(same_address(a, b), *same, "{a:?} vs {b:?}");
            assert_eq!(same_address(b, a), *same, "{b:?} vs {a:?}");
        }
    }

    #[test]
    fn a_refusal_names_the_node_and_why_and_clips_the_address() {
        let text = unsafe_address_refusal("worker-3", "-oProxyCommand=x").unwrap();
        assert!(
            text.starts_with(
                "node worker-3 cannot be rebooted by command: its address \"-oProxyCommand=x\" \
                 (from the Node's status) is not an IP address or a DNS name: it starts with '-'"
            ),
            "{text}"
        );
        assert!(text.contains("commands are not run"), "{text}");
        assert_eq!(unsafe_address_refusal("worker-3", "10.0.0.3"), None);

        // A huge value is clipped; control characters are escaped, not written.
        let huge = format!("-{}\n{}", "x".repeat(100_000), "y".repeat(10));
        let text = unsafe_address_refusal("w", &huge).unwrap();
        assert!(text.len() < 600, "{} bytes", text.len());
        assert!(text.contains("… (100012 characters)"), "{text}");
        let text = unsafe_address_refusal("w", "a\nb\u{1b}[31m").unwrap();
        assert!(!text.contains('\n') && !text.contains('\u{1b}'), "{text:?}");
        assert!(text.contains(r#""a\nb\u{1b}[31m""#), "{text}");
    }
}
