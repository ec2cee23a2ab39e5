//! Which BareMetalHost belongs to a Node, a Machine or a remediation request: one resolver for
//! the reboot queue, both remediation triggers, the orphan sweep and `hostcycle rq plan`.
//!
//! **Authoritative links** are written by the machinery that provisioned the host:
//! - a Machine's `metal3.io/BareMetalHost` annotation (`<namespace>/<name>`, or a bare name in
//!   the Machine's namespace);
//! - a host whose `spec.consumerRef` is the Machine or its `spec.infrastructureRef` (CAPM3's
//!   Metal3Machine) — only in the host's own namespace (the consumer and the Machine both):
//!   a consumerRef into another namespace links nothing, so it can neither capture nor block
//!   that namespace's Machine (it still keeps hints off its own host). A consumerRef that
//!   disagrees with the Machine's own annotation is a conflict, like any two disagreeing links;
//! - the Node's `spec.providerID` when it carries the host's uid: `metal3://<host-uid>` (older
//!   CAPM3), `baremetalhost:///<namespace>/<host>/<uid>` (OpenShift) — the uid must be the
//!   host's. A uid-less one (`metal3://<namespace>/<host>/<metal3machine>`, CAPM3's) names the
//!   host by name only, and whoever registers or edits the Node writes it: it is authoritative
//!   only where it names the host the node's Machine links name too, and a hint otherwise.
//!
//! A Machine belongs to the Node its `status.nodeRef` names.
//!
//! **Hints** may be written by less trusted hands (a kubelet may edit its own Node's
//! annotations and registers its provider ID; a host may be named like anything): the Node's
//! uid-less provider ID, its `hostcycle.io/baremetalhost` annotation and the only host with the
//! Node's name, in that order; a node's hints must agree. A hint is used only when the node has
//! no authoritative link at all, and only for a host that is linked to no other node or
//! Machine (a uid-less provider ID may name the host's own Metal3Machine consumer) and that no
//! other node's hint names. A uid-less provider ID or annotation naming another host than the
//! node's authoritative links is ignored and reported ([`Binding::ignored_hint`]).
//!
//! Anything else is refused, with a reason that names both candidates: sources that disagree,
//! a link to a host that does not exist (or exists under another uid), or two nodes on one
//! host. A refusal means no power action.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use hostcycle_api::queue::{HostReference, NODE_HOST_ANNOTATION};

/// Annotation on a Machine (OpenShift, CAPM3's Metal3Machine) naming its host.
pub const MACHINE_HOST_ANNOTATION: &str = "metal3.io/BareMetalHost";

/// An object reference as found in `consumerRef` / `infrastructureRef`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// A BareMetalHost, reduced to what binds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    pub reference: HostReference,
    pub uid: String,
    /// `spec.consumerRef` (its namespace defaults to the host's).
    pub consumer: Option<ObjectKey>,
}

/// A Machine (either kind), reduced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineFacts {
    pub key: ObjectKey,
    /// `status.nodeRef.name`.
    pub node_name: Option<String>,
    /// Its `metal3.io/BareMetalHost` annotation, as written.
    pub host_annotation: Option<String>,
    /// `spec.infrastructureRef` (its namespace defaults to the Machine's).
    pub infrastructure: Option<ObjectKey>,
}

/// A Node, reduced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeFacts {
    pub name: String,
    pub provider_id: Option<String>,
    /// Its `hostcycle.io/baremetalhost` annotation, as written.
    pub host_annotation: Option<String>,
}

impl NodeFacts {
    /// From a Node's name, provider ID and annotations.
    pub fn new(
        name: &str,
        provider_id: Option<&str>,
        annotations: &BTreeMap<String, String>,
    ) -> NodeFacts {
        NodeFacts {
            name: name.to_string(),
            provider_id: provider_id.map(str::to_string),
            host_annotation: annotations.get(NODE_HOST_ANNOTATION).cloned(),
        }
    }
}

/// What links a host to a node or Machine.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Link {
    /// The Machine's `metal3.io/BareMetalHost` annotation.
    MachineAnnotation { machine: ObjectKey },
    /// The host's `spec.consumerRef` is the Machine, or its infrastructure object.
    ConsumerRef {
        machine: ObjectKey,
        consumer: ObjectKey,
    },
    /// The Node's `spec.providerID`: with the host's uid, or agreeing with the node's Machine.
    ProviderId { node: String, provider_id: String },
    /// Hint: the Node's uid-less `spec.providerID` (`metal3://<namespace>/<host>/<x>`), alone.
    ProviderIdHint { node: String, provider_id: String },
    /// Hint: the Node's `hostcycle.io/baremetalhost` annotation.
    NodeAnnotation { node: String },
    /// Hint: the only host named like the Node.
    SameName { node: String },
}

impl Link {
    /// Written by the provisioning machinery, not by the node itself.
    pub fn authoritative(&self) -> bool {
        !matches!(
            self,
            Link::ProviderIdHint { .. } | Link::NodeAnnotation { .. } | Link::SameName { .. }
        )
    }

    /// Short machine-friendly form, for logs and status.
    pub fn code(&self) -> &'static str {
        match self {
            Link::MachineAnnotation { .. } => "MachineAnnotation",
            Link::ConsumerRef { .. } => "ConsumerRef",
            Link::ProviderId { .. } => "ProviderID",
            Link::ProviderIdHint { .. } => "ProviderIDHint",
            Link::NodeAnnotation { .. } => "NodeAnnotation",
            Link::SameName { .. } => "SameName",
        }
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::MachineAnnotation { machine } => {
                write!(f, "the {MACHINE_HOST_ANNOTATION} annotation of {machine}")
            }
            Link::ConsumerRef { machine, consumer } if machine == consumer => {
                write!(f, "the host's consumerRef ({machine})")
            }
            Link::ConsumerRef { machine, consumer } => write!(
                f,
                "the host's consumerRef ({consumer}, the infrastructure of {machine})"
            ),
            Link::ProviderId { node, provider_id } => {
                write!(f, "the providerID of node {node} ({provider_id})")
            }
            Link::ProviderIdHint { node, provider_id } => {
                write!(
                    f,
                    "the providerID of node {node} ({provider_id}, without the host's uid: a hint)"
                )
            }
            Link::NodeAnnotation { node } => {
                write!(
                    f,
                    "the {NODE_HOST_ANNOTATION} annotation of node {node} (a hint)"
                )
            }
            Link::SameName { node } => write!(f, "its name, the same as node {node}'s (a hint)"),
        }
    }
}

/// Who a host is linked to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Claimant {
    Node(String),
    Machine(ObjectKey),
    /// A consumer that is no Machine this operator sees (e.g. a Metal3Machine of a Machine
    /// it cannot read).
    Object(ObjectKey),
}

impl fmt::Display for Claimant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Claimant::Node(n) => write!(f, "node {n}"),
            Claimant::Machine(m) => write!(f, "{m}"),
            Claimant::Object(o) => write!(f, "{o}"),
        }
    }
}

/// A host found for a node, Machine or request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub host: HostReference,
    pub uid: String,
    /// The link it was found by (the strongest, when several agree).
    pub link: Link,
    /// A Node annotation or uid-less provider ID naming another host, ignored because an
    /// authoritative link exists: worth a Warning (a kubelet may write its own Node's
    /// annotations, and registers its provider ID).
    pub ignored_hint: Option<(HostReference, Link)>,
}

/// Why no host is bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No link and no hint names a host.
    NoHost { subject: String },
    /// The only link names a host that does not exist.
    Missing {
        subject: String,
        host: HostReference,
        link: Link,
    },
    /// The link names a host by a uid (provider ID) that is not the host's: the host was
    /// replaced under the same name, or the uid names none.
    UidMismatch {
        subject: String,
        host: Option<HostReference>,
        uid: String,
        link: Link,
    },
    /// Two sources name different hosts.
    Conflict {
        subject: String,
        first: (HostReference, Link),
        second: (HostReference, Link),
    },
    /// The host also belongs to someone else: another node or Machine resolves to it.
    Shared {
        subject: String,
        host: HostReference,
        link: Link,
        other: Claimant,
        other_link: Link,
    },
    /// More than one host is named like the node (in different namespaces), and nothing
    /// else names one.
    Ambiguous {
        subject: String,
        hosts: Vec<HostReference>,
    },
}

impl Refusal {
    /// The condition / Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NoHost { .. } | Refusal::Ambiguous { .. } => "HostNotReferenced",
            Refusal::Missing { .. } => "HostNotFound",
            Refusal::UidMismatch { .. } => "HostReplaced",
            Refusal::Conflict { .. } | Refusal::Shared { .. } => "HostBindingConflict",
        }
    }

    /// A conflict between sources (a Warning), as opposed to nothing found yet.
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            Refusal::Conflict { .. } | Refusal::Shared { .. } | Refusal::UidMismatch { .. }
        )
    }

    /// The hosts it is about, for wake-ups.
    pub fn hosts(&self) -> Vec<&HostReference> {
        match self {
            Refusal::NoHost { .. } => Vec::new(),
            Refusal::Missing { host, .. } | Refusal::Shared { host, .. } => vec![host],
            Refusal::UidMismatch { host, .. } => host.iter().collect(),
            Refusal::Conflict { first, second, .. } => vec![&first.0, &second.0],
            Refusal::Ambiguous { hosts, .. } => hosts.iter().collect(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NoHost { subject } => write!(
                f,
                "no BareMetalHost found for {subject}: name it with the Machine's \
                 {MACHINE_HOST_ANNOTATION} annotation, the host's consumerRef or the Node's \
                 providerID (or, where nothing else links it, the Node's {NODE_HOST_ANNOTATION} \
                 annotation)"
            ),
            Refusal::Missing {
                subject,
                host,
                link,
            } => write!(
                f,
                "BareMetalHost {host}, named for {subject} by {link}, does not exist"
            ),
            Refusal::UidMismatch {
                subject,
                host: Some(host),
                uid,
                link,
            } => write!(
                f,
                "{link} names BareMetalHost {host} with uid {uid} for {subject}, but {host} \
                 has another uid (replaced under the same name): not the same host"
            ),
            Refusal::UidMismatch {
                subject, uid, link, ..
            } => write!(
                f,
                "{link} names the BareMetalHost with uid {uid} for {subject}; no host has it"
            ),
            Refusal::Conflict {
                subject,
                first,
                second,
            } => write!(
                f,
                "sources disagree on the BareMetalHost of {subject}: {} by {}, {} by {}; \
                 nothing is powered until they agree",
                first.0, first.1, second.0, second.1
            ),
            Refusal::Shared {
                subject,
                host,
                link,
                other,
                other_link,
            } => write!(
                f,
                "BareMetalHost {host} is named for {subject} by {link} and for {other} by \
                 {other_link}; nothing is powered until only one of them claims it"
            ),
            Refusal::Ambiguous { subject, hosts } => write!(
                f,
                "{} BareMetalHosts are named like {subject} ({}); link the right one",
                hosts.len(),
                hosts
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// A host as bound when a flow started: every later step acts on this host, never on a new
/// lookup (a Node the flow deleted resolves no more), and a host re-created under the same
/// name (another uid) is not it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BoundHost {
    pub reference: HostReference,
    pub uid: String,
}

impl BoundHost {
    /// Reads `<namespace>/<name>/<uid>`.
    pub fn parse(text: &str) -> Option<BoundHost> {
        let mut parts = text.trim().splitn(3, '/');
        let (namespace, name, uid) = (parts.next()?, parts.next()?, parts.next()?);
        (!namespace.is_empty() && !name.is_empty() && !uid.is_empty() && !uid.contains('/')).then(
            || BoundHost {
                reference: HostReference {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                },
                uid: uid.to_string(),
            },
        )
    }
}

impl fmt::Display for BoundHost {
    /// `<namespace>/<name>/<uid>`, what [`BoundHost::parse`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.reference, self.uid)
    }
}

impl From<&Binding> for BoundHost {
    fn from(b: &Binding) -> Self {
        BoundHost {
            reference: b.host.clone(),
            uid: b.uid.clone(),
        }
    }
}

/// The outcome of a lookup (a refusal is boxed: it is rare and carries both candidates).
pub type Resolution = Result<Binding, Box<Refusal>>;

/// Parses `<namespace>/<name>`; with `default_namespace`, a bare `<name>` too.
pub fn parse_host_ref(text: &str, default_namespace: Option<&str>) -> Option<HostReference> {
    let text = text.trim();
    let reference = match text.split_once('/') {
        Some((namespace, name)) => HostReference {
            namespace: namespace.to_string(),
            name: name.to_string(),
        },
        None => HostReference {
            namespace: default_namespace?.to_string(),
            name: text.to_string(),
        },
    };
    // Kubernetes names: a namespace is a DNS label, a host name a DNS subdomain. Anything
    // else (a forged 256 KiB annotation included) names no host and is never echoed whole.
    (is_dns_name(&reference.namespace, 63, false) && is_dns_name(&reference.name, 253, true))
        .then_some(reference)
}

/// Lowercase letters, digits and `-` (and `.` when `dots`), starting and ending with a
/// letter or digit, at most `max` bytes.
fn is_dns_name(text: &str, max: usize, dots: bool) -> bool {
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    text.len() <= max
        && edge_ok(text.chars().next())
        && edge_ok(text.chars().last())
        && text.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.')
        })
}

/// What a provider ID names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ProviderTarget {
    /// A host by namespace and name. `uid`: the uid it must have (`baremetalhost:///…/<uid>`);
    /// `metal3_machine`: the Metal3Machine CAPM3 wrote as the third part
    /// (`metal3://<namespace>/<host>/<metal3machine>`).
    Path {
        host: HostReference,
        uid: Option<String>,
        metal3_machine: Option<String>,
    },
    /// `metal3://<host-uid>`.
    Uid(String),
}

impl ProviderTarget {
    /// Carries the host's uid: written only by whoever could read the host.
    fn carries_uid(&self) -> bool {
        matches!(
            self,
            ProviderTarget::Uid(_) | ProviderTarget::Path { uid: Some(_), .. }
        )
    }
}

fn parse_provider_id(id: &str) -> Option<ProviderTarget> {
    let id = id.trim();
    let path = |rest: &str, metal3: bool| {
        let mut parts = rest.split('/').filter(|p| !p.is_empty());
        let namespace = parts.next()?;
        let name = parts.next()?;
        let third = parts.next().map(str::to_string);
        let (uid, metal3_machine) = if metal3 { (None, third) } else { (third, None) };
        Some(ProviderTarget::Path {
            host: HostReference {
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
            uid,
            metal3_machine,
        })
    };
    if let Some(rest) = id.strip_prefix("metal3://") {
        if rest.contains('/') {
            path(rest, true)
        } else if rest.is_empty() {
            None
        } else {
            Some(ProviderTarget::Uid(rest.to_string()))
        }
    } else if let Some(rest) = id.strip_prefix("baremetalhost://") {
        path(rest, false)
    } else {
        None
    }
}

/// One link as found, before it is checked.
#[derive(Debug, Clone)]
struct Candidate {
    /// `None`: a uid that names no host.
    host: Option<HostReference>,
    /// The uid the link requires, if it carries one.
    uid: Option<String>,
    link: Link,
}

/// The hosts, Machines and Nodes of one moment, indexed for lookups. Build it once per pass.
#[derive(Debug, Clone, Default)]
pub struct BindingIndex {
    hosts: BTreeMap<HostReference, HostFacts>,
    by_uid: BTreeMap<String, HostReference>,
    by_name: BTreeMap<String, Vec<HostReference>>,
    /// `spec.consumerRef` → the hosts naming it.
    by_consumer: BTreeMap<ObjectKey, Vec<HostReference>>,
    machines: BTreeMap<ObjectKey, MachineFacts>,
    machines_of_node: BTreeMap<String, Vec<ObjectKey>>,
    /// Machine (or infrastructure object) key → the Machine.
    machine_of_consumer: BTreeMap<ObjectKey, ObjectKey>,
    nodes: BTreeMap<String, NodeFacts>,
    /// Every authoritative link to each host, with who holds it.
    claims: BTreeMap<HostReference, Vec<(Claimant, Link)>>,
    /// The hint each node without an authoritative link would use.
    hint_claims: BTreeMap<HostReference, Vec<(String, Link)>>,
}

impl BindingIndex {
    pub fn new(
        hosts: impl IntoIterator<Item = HostFacts>,
        machines: impl IntoIterator<Item = MachineFacts>,
        nodes: impl IntoIterator<Item = NodeFacts>,
    ) -> BindingIndex {
        let mut index = BindingIndex::default();
        for host in hosts {
            if !host.uid.is_empty() {
                index
                    .by_uid
                    .insert(host.uid.clone(), host.reference.clone());
            }
            index
                .by_name
                .entry(host.reference.name.clone())
                .or_default()
                .push(host.reference.clone());
            // A consumerRef into another namespace links nothing (it still claims its host).
            if let Some(consumer) = host
                .consumer
                .as_ref()
                .filter(|c| c.namespace == host.reference.namespace)
            {
                index
                    .by_consumer
                    .entry(consumer.clone())
                    .or_default()
                    .push(host.reference.clone());
            }
            index.hosts.insert(host.reference.clone(), host);
        }
        for machine in machines {
            if let Some(node) = &machine.node_name {
                index
                    .machines_of_node
                    .entry(node.clone())
                    .or_default()
                    .push(machine.key.clone());
            }
            index
                .machine_of_consumer
                .insert(machine.key.clone(), machine.key.clone());
            if let Some(infra) = &machine.infrastructure {
                index
                    .machine_of_consumer
                    .insert(infra.clone(), machine.key.clone());
            }
            index.machines.insert(machine.key.clone(), machine);
        }
        for node in nodes {
            index.nodes.insert(node.name.clone(), node);
        }
        index.claims = index.collect_claims();
        index.hint_claims = index.collect_hint_claims();
        index
    }

    /// A host by namespace and name.
    pub fn host(&self, reference: &HostReference) -> Option<&HostFacts> {
        self.hosts.get(reference)
    }

    /// The host of a node (its Node object may be gone: Machines still name it).
    pub fn node(&self, node: &str) -> Resolution {
        let subject = format!("node {node}");
        let candidates = self.node_links(node);
        if candidates.is_empty() {
            return self.by_hint(node, &subject);
        }
        let mut binding = self.check(&subject, candidates, |claimant| match claimant {
            Claimant::Node(n) => n == node,
            Claimant::Machine(m) => self.machine_node(m) == Some(node),
            // A consumer this operator cannot see does not outvote the node's own links.
            Claimant::Object(_) => true,
        })?;
        binding.ignored_hint = self.contrary_hint(node, &binding.host);
        Ok(binding)
    }

    /// The node's uid-less provider ID or annotation, when it names another host than the one
    /// bound (both are written by the node's side; a same-name host proves nothing either way).
    fn contrary_hint(&self, node: &str, bound: &HostReference) -> Option<(HostReference, Link)> {
        self.provider_id_hint(node)
            .into_iter()
            .chain(self.annotation_hint(node).and_then(Result::ok))
            .find(|(host, _)| host != bound)
    }

    /// The host of a Machine: its own links, its Node's provider ID, and, when neither names
    /// one, its Node's hints.
    pub fn machine(&self, key: &ObjectKey) -> Resolution {
        let subject = key.to_string();
        let node = self.machine_node(key).map(str::to_string);
        let mut candidates = self.machine_links(key);
        if let Some(node) = &node {
            let provider_id = self.provider_id_link(node, &candidates);
            candidates.extend(provider_id);
        }
        if candidates.is_empty() {
            return match &node {
                Some(node) => self.node(node),
                None => Err(Box::new(Refusal::NoHost { subject })),
            };
        }
        let mut binding = self.check(&subject, candidates, |claimant| match claimant {
            Claimant::Machine(m) => m == key,
            Claimant::Node(n) => node.as_deref() == Some(n.as_str()),
            Claimant::Object(_) => true,
        })?;
        binding.ignored_hint = node
            .as_deref()
            .and_then(|n| self.contrary_hint(n, &binding.host));
        Ok(binding)
    }

    /// The node a Machine's `status.nodeRef` names.
    pub fn machine_node(&self, key: &ObjectKey) -> Option<&str> {
        self.machines.get(key)?.node_name.as_deref()
    }

    /// Everyone an authoritative link ties `host` to.
    pub fn claims(&self, host: &HostReference) -> &[(Claimant, Link)] {
        self.claims.get(host).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Checks a non-empty set of authoritative candidates: one host, existing, with the uid
    /// the links require, claimed by nobody outside `ours`.
    fn check(
        &self,
        subject: &str,
        candidates: Vec<Candidate>,
        ours: impl Fn(&Claimant) -> bool,
    ) -> Resolution {
        // Disagreement first: two different hosts named is a conflict whatever else is wrong.
        let mut distinct: Vec<(&Option<HostReference>, &Candidate)> = Vec::new();
        for c in &candidates {
            if !distinct.iter().any(|(h, _)| **h == c.host) {
                distinct.push((&c.host, c));
            }
        }
        if let [(_, a), (_, b), ..] = distinct.as_slice() {
            let named = |c: &Candidate| {
                c.host.clone().unwrap_or_else(|| HostReference {
                    namespace: "?".into(),
                    name: format!("uid {}", c.uid.as_deref().unwrap_or("?")),
                })
            };
            return Err(Box::new(Refusal::Conflict {
                subject: subject.to_string(),
                first: (named(a), a.link.clone()),
                second: (named(b), b.link.clone()),
            }));
        }
        let strongest = candidates
            .iter()
            .min_by_key(|c| strength(&c.link))
            .cloned()
            .ok_or_else(|| {
                Box::new(Refusal::NoHost {
                    subject: subject.to_string(),
                })
            })?;
        let Some(reference) = strongest.host.clone() else {
            return Err(Box::new(Refusal::UidMismatch {
                subject: subject.to_string(),
                host: None,
                uid: strongest.uid.clone().unwrap_or_default(),
                link: strongest.link.clone(),
            }));
        };
        let Some(host) = self.hosts.get(&reference) else {
            return Err(Box::new(Refusal::Missing {
                subject: subject.to_string(),
                host: reference,
                link: strongest.link,
            }));
        };
        if let Some(c) = candidates
            .iter()
            .find(|c| c.uid.as_ref().is_some_and(|uid| *uid != host.uid))
        {
            return Err(Box::new(Refusal::UidMismatch {
                subject: subject.to_string(),
                host: Some(reference),
                uid: c.uid.clone().unwrap_or_default(),
                link: c.link.clone(),
            }));
        }
        if let Some((other, other_link)) = self.claims(&reference).iter().find(|(c, _)| !ours(c)) {
            return Err(Box::new(Refusal::Shared {
                subject: subject.to_string(),
                host: reference,
                link: strongest.link,
                other: other.clone(),
                other_link: other_link.clone(),
            }));
        }
        Ok(Binding {
            host: reference,
            uid: host.uid.clone(),
            link: strongest.link,
            ignored_hint: None,
        })
    }

    /// A node without authoritative links: its hint, if the host is nobody else's.
    fn by_hint(&self, node: &str, subject: &str) -> Resolution {
        let (host, link) = self.chosen_hint(node, subject)?;
        let reference = host.reference.clone();
        let shared = |other: &Claimant, other_link: &Link| {
            Box::new(Refusal::Shared {
                subject: subject.to_string(),
                host: reference.clone(),
                link: link.clone(),
                other: other.clone(),
                other_link: other_link.clone(),
            })
        };
        if let Some((other, other_link)) = self
            .claims(&reference)
            .iter()
            .find(|(claimant, _)| !hint_names_its_consumer(&link, host, claimant))
        {
            return Err(shared(other, other_link));
        }
        if let Some((other, other_link)) = self
            .hint_claims
            .get(&reference)
            .into_iter()
            .flatten()
            .find(|(n, _)| n != node)
        {
            return Err(shared(&Claimant::Node(other.clone()), other_link));
        }
        Ok(Binding {
            host: reference,
            uid: host.uid.clone(),
            link,
            ignored_hint: None,
        })
    }

    /// The hint a node without authoritative links goes by: the strongest of its uid-less
    /// provider ID, its annotation and the only host named like it, which must exist and which
    /// the others must not contradict. An annotation that does not parse is no hint; several
    /// hosts named like the node are ambiguous only when nothing else names one.
    fn chosen_hint(&self, node: &str, subject: &str) -> Result<(&HostFacts, Link), Box<Refusal>> {
        let mut named: Vec<(HostReference, Link)> = Vec::new();
        named.extend(self.provider_id_hint(node));
        named.extend(self.annotation_hint(node).and_then(Result::ok));
        match self.same_name_hint(node) {
            Some(Ok(hint)) => named.push(hint),
            Some(Err(hosts)) if named.is_empty() => {
                return Err(Box::new(Refusal::Ambiguous {
                    subject: subject.to_string(),
                    hosts,
                }));
            }
            _ => {}
        }
        let Some((reference, link)) = named.first() else {
            return Err(Box::new(Refusal::NoHost {
                subject: subject.to_string(),
            }));
        };
        let Some(host) = self.hosts.get(reference) else {
            return Err(Box::new(Refusal::Missing {
                subject: subject.to_string(),
                host: reference.clone(),
                link: link.clone(),
            }));
        };
        if let Some(other) = named.iter().find(|(h, _)| h != reference) {
            return Err(Box::new(Refusal::Conflict {
                subject: subject.to_string(),
                first: (reference.clone(), link.clone()),
                second: other.clone(),
            }));
        }
        Ok((host, link.clone()))
    }

    /// The node's uid-less provider ID as a hint (one with a uid is a link, never a hint).
    fn provider_id_hint(&self, node: &str) -> Option<(HostReference, Link)> {
        let provider_id = self.nodes.get(node)?.provider_id.as_deref()?;
        match parse_provider_id(provider_id)? {
            ProviderTarget::Path {
                host, uid: None, ..
            } => Some((
                host,
                Link::ProviderIdHint {
                    node: node.to_string(),
                    provider_id: provider_id.trim().to_string(),
                },
            )),
            _ => None,
        }
    }

    /// The node's annotation as a hint: `None` when absent, `Err` when it does not parse.
    fn annotation_hint(&self, node: &str) -> Option<Result<(HostReference, Link), ()>> {
        let value = self.nodes.get(node)?.host_annotation.as_deref()?;
        Some(
            parse_host_ref(value, None)
                .map(|r| {
                    (
                        r,
                        Link::NodeAnnotation {
                            node: node.to_string(),
                        },
                    )
                })
                .ok_or(()),
        )
    }

    /// The only host named like the node: `Err` with them all when there are several.
    fn same_name_hint(
        &self,
        node: &str,
    ) -> Option<Result<(HostReference, Link), Vec<HostReference>>> {
        match self.by_name.get(node).map(Vec::as_slice) {
            None | Some([]) => None,
            Some([only]) => Some(Ok((
                only.clone(),
                Link::SameName {
                    node: node.to_string(),
                },
            ))),
            Some(many) => Some(Err(many.to_vec())),
        }
    }

    /// The hint a node would use (uid-less provider ID, then annotation, then same name),
    /// ignoring whether it is valid.
    fn node_hint(&self, node: &str) -> Option<(HostReference, Link)> {
        self.provider_id_hint(node)
            .or_else(|| self.annotation_hint(node).and_then(Result::ok))
            .or_else(|| self.same_name_hint(node).and_then(Result::ok))
    }

    /// The authoritative links of a node: its Machines' and its provider ID.
    fn node_links(&self, node: &str) -> Vec<Candidate> {
        let mut out = self.machine_links_of_node(node);
        let provider_id = self.provider_id_link(node, &out);
        out.extend(provider_id);
        out
    }

    /// The links of the Machines whose nodeRef is `node`.
    fn machine_links_of_node(&self, node: &str) -> Vec<Candidate> {
        self.machines_of_node
            .get(node)
            .into_iter()
            .flatten()
            .flat_map(|m| self.machine_links(m))
            .collect()
    }

    /// A Machine's own links: its annotation, and hosts consuming it or its infrastructure.
    fn machine_links(&self, key: &ObjectKey) -> Vec<Candidate> {
        let Some(machine) = self.machines.get(key) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Some(reference) = machine
            .host_annotation
            .as_deref()
            .and_then(|v| parse_host_ref(v, Some(&key.namespace)))
        {
            out.push(Candidate {
                host: Some(reference),
                uid: None,
                link: Link::MachineAnnotation {
                    machine: key.clone(),
                },
            });
        }
        for consumer in std::iter::once(&machine.key).chain(machine.infrastructure.iter()) {
            // `by_consumer` holds consumers of their host's namespace; the Machine must be
            // there too (an infrastructureRef may name another namespace).
            let hosts = self.by_consumer.get(consumer).into_iter().flatten();
            for host in hosts.filter(|h| h.namespace == key.namespace) {
                out.push(Candidate {
                    host: Some(host.clone()),
                    uid: None,
                    link: Link::ConsumerRef {
                        machine: key.clone(),
                        consumer: consumer.clone(),
                    },
                });
            }
        }
        out
    }

    /// The node's provider ID as an authoritative link: when it carries a uid (checked against
    /// the host's later), or, uid-less, when it names a host `machine_links` (the node's
    /// Machines') name too. A uid-less one alone is a hint ([`Self::provider_id_hint`]).
    fn provider_id_link(&self, node: &str, machine_links: &[Candidate]) -> Option<Candidate> {
        let provider_id = self.nodes.get(node)?.provider_id.as_deref()?;
        let target = parse_provider_id(provider_id)?;
        let carries_uid = target.carries_uid();
        let link = Link::ProviderId {
            node: node.to_string(),
            provider_id: provider_id.trim().to_string(),
        };
        let candidate = match target {
            ProviderTarget::Path { host, uid, .. } => Candidate {
                host: Some(host),
                uid,
                link,
            },
            ProviderTarget::Uid(uid) => Candidate {
                host: self.by_uid.get(&uid).cloned(),
                uid: Some(uid),
                link,
            },
        };
        let agrees = || machine_links.iter().any(|m| m.host == candidate.host);
        (carries_uid || agrees()).then_some(candidate)
    }

    /// The Machine a host's consumerRef links it to: a Machine of the host's namespace, named
    /// by the consumerRef itself or through its infrastructure object there.
    fn consumer_machine(&self, host: &HostFacts) -> Option<&ObjectKey> {
        let consumer = host
            .consumer
            .as_ref()
            .filter(|c| c.namespace == host.reference.namespace)?;
        self.machine_of_consumer
            .get(consumer)
            .filter(|m| m.namespace == host.reference.namespace)
    }

    fn collect_claims(&self) -> BTreeMap<HostReference, Vec<(Claimant, Link)>> {
        let mut claims: BTreeMap<HostReference, Vec<(Claimant, Link)>> = BTreeMap::new();
        for machine in self.machines.values() {
            if let Some(reference) = machine
                .host_annotation
                .as_deref()
                .and_then(|v| parse_host_ref(v, Some(&machine.key.namespace)))
            {
                claims.entry(reference).or_default().push((
                    Claimant::Machine(machine.key.clone()),
                    Link::MachineAnnotation {
                        machine: machine.key.clone(),
                    },
                ));
            }
        }
        for host in self.hosts.values() {
            if let Some(consumer) = &host.consumer {
                // Another namespace's Machine is never claimed: the host is taken by an object.
                let (claimant, link) = match self.consumer_machine(host) {
                    Some(machine) => (
                        Claimant::Machine(machine.clone()),
                        Link::ConsumerRef {
                            machine: machine.clone(),
                            consumer: consumer.clone(),
                        },
                    ),
                    None => (
                        Claimant::Object(consumer.clone()),
                        Link::ConsumerRef {
                            machine: consumer.clone(),
                            consumer: consumer.clone(),
                        },
                    ),
                };
                claims
                    .entry(host.reference.clone())
                    .or_default()
                    .push((claimant, link));
            }
        }
        for node in self.nodes.values() {
            let machine_links = self.machine_links_of_node(&node.name);
            if let Some(Candidate {
                host: Some(reference),
                link,
                ..
            }) = self.provider_id_link(&node.name, &machine_links)
            {
                claims
                    .entry(reference)
                    .or_default()
                    .push((Claimant::Node(node.name.clone()), link));
            }
        }
        claims
    }

    fn collect_hint_claims(&self) -> BTreeMap<HostReference, Vec<(String, Link)>> {
        let mut out: BTreeMap<HostReference, Vec<(String, Link)>> = BTreeMap::new();
        for node in self.nodes.keys() {
            if !self.node_links(node).is_empty() {
                continue;
            }
            if let Some((host, link)) = self.node_hint(node) {
                out.entry(host).or_default().push((node.clone(), link));
            }
        }
        out
    }

    /// Every node (with a Node object) bound to a host, and every refusal, for a sweep that
    /// needs the whole picture.
    pub fn nodes(&self) -> impl Iterator<Item = (&str, Resolution)> + '_ {
        self.nodes.keys().map(|n| (n.as_str(), self.node(n)))
    }

    /// The nodes bound to `host`: every node (a Node, or a Machine's `status.nodeRef` whose
    /// Node may be gone) that a link or hint ties to it and that [`Self::node`] resolves to
    /// it.
    pub fn nodes_of_host(&self, host: &HostReference) -> BTreeSet<String> {
        let mut candidates: BTreeSet<&str> = BTreeSet::new();
        for (claimant, _) in self.claims(host) {
            match claimant {
                Claimant::Node(n) => {
                    candidates.insert(n);
                }
                Claimant::Machine(m) => candidates.extend(self.machine_node(m)),
                Claimant::Object(_) => {}
            }
        }
        for (node, _) in self.hint_claims.get(host).into_iter().flatten() {
            candidates.insert(node);
        }
        candidates
            .into_iter()
            .filter(|n| self.node(n).is_ok_and(|b| b.host == *host))
            .map(str::to_string)
            .collect()
    }

    /// Names of the Nodes the index knows.
    pub fn node_names(&self) -> BTreeSet<&str> {
        self.nodes.keys().map(String::as_str).collect()
    }
}

/// Whether `claimant` is the host's own Metal3Machine consumer, named by the uid-less provider
/// ID `link` (`metal3://<namespace>/<host>/<metal3machine>`, CAPM3's form): the hint agrees with
/// it, so it is no other claimant (a cluster whose Machines this operator cannot read).
fn hint_names_its_consumer(link: &Link, host: &HostFacts, claimant: &Claimant) -> bool {
    let (Link::ProviderIdHint { provider_id, .. }, Claimant::Object(consumer)) = (link, claimant)
    else {
        return false;
    };
    let Some(ProviderTarget::Path {
        metal3_machine: Some(metal3_machine),
        ..
    }) = parse_provider_id(provider_id)
    else {
        return false;
    };
    host.consumer.as_ref() == Some(consumer)
        && consumer.kind == "Metal3Machine"
        && consumer.namespace == host.reference.namespace
        && consumer.name == metal3_machine
}

/// Which link wins when several agree (lower is stronger).
fn strength(link: &Link) -> u8 {
    match link {
        Link::MachineAnnotation { .. } => 0,
        Link::ConsumerRef { .. } => 1,
        Link::ProviderId { .. } => 2,
        Link::ProviderIdHint { .. } => 3,
        Link::NodeAnnotation { .. } => 4,
        Link::SameName { .. } => 5,
    }
}
