//! Which host belongs to a node or Machine (`hostcycle_core::binding`), as tables: each
//! authoritative rule, each conflict, the hints and when they are refused, two nodes on one
//! host, namespaces; and what the queue reboots with (`queue::host::reboot_target`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use hostcycle_api::queue::{HostReference, NODE_HOST_ANNOTATION};
use hostcycle_core::binding::{
    BindingIndex, Claimant, HostFacts, Link, MACHINE_HOST_ANNOTATION, MachineFacts, NodeFacts,
    ObjectKey, parse_host_ref,
};
use hostcycle_core::queue::RebootTarget;
use hostcycle_core::queue::host::reboot_target;

fn r(namespace: &str, name: &str) -> HostReference {
    HostReference {
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn key(kind: &str, namespace: &str, name: &str) -> ObjectKey {
    ObjectKey {
        kind: kind.into(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn host(namespace: &str, name: &str) -> HostFacts {
    HostFacts {
        reference: r(namespace, name),
        uid: format!("uid-{namespace}-{name}"),
        consumer: None,
    }
}

trait HostBuild {
    fn uid(self, uid: &str) -> Self;
    fn consumed_by(self, consumer: ObjectKey) -> Self;
}

impl HostBuild for HostFacts {
    fn uid(mut self, uid: &str) -> Self {
        self.uid = uid.into();
        self
    }
    fn consumed_by(mut self, consumer: ObjectKey) -> Self {
        self.consumer = Some(consumer);
        self
    }
}

fn node(name: &str) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        ..NodeFacts::default()
    }
}

trait NodeBuild {
    fn provider_id(self, id: &str) -> Self;
    fn annotated(self, value: &str) -> Self;
}

impl NodeBuild for NodeFacts {
    fn provider_id(mut self, id: &str) -> Self {
        self.provider_id = Some(id.into());
        self
    }
    fn annotated(mut self, value: &str) -> Self {
        self.host_annotation = Some(value.into());
        self
    }
}

/// A CAPI Machine (namespace `capi`) whose nodeRef is `node`.
fn machine(name: &str, node: &str) -> MachineFacts {
    MachineFacts {
        key: key("Machine", "capi", name),
        node_name: Some(node.into()),
        host_annotation: None,
        infrastructure: None,
    }
}

trait MachineBuild {
    fn host_annotation(self, value: &str) -> Self;
    fn infrastructure(self, infra: ObjectKey) -> Self;
    fn namespace(self, namespace: &str) -> Self;
    fn no_node(self) -> Self;
}

impl MachineBuild for MachineFacts {
    fn host_annotation(mut self, value: &str) -> Self {
        self.host_annotation = Some(value.into());
        self
    }
    fn infrastructure(mut self, infra: ObjectKey) -> Self {
        self.infrastructure = Some(infra);
        self
    }
    fn namespace(mut self, namespace: &str) -> Self {
        self.key.namespace = namespace.into();
        self
    }
    fn no_node(mut self) -> Self {
        self.node_name = None;
        self
    }
}

/// What a lookup should give: a host and the rule, or a refusal's reason and words it says.
#[derive(Debug)]
enum Want {
    Host(HostReference, &'static str),
    Refused(&'static str, &'static [&'static str]),
}

struct Case {
    name: &'static str,
    hosts: Vec<HostFacts>,
    machines: Vec<MachineFacts>,
    nodes: Vec<NodeFacts>,
    /// The node looked up (`w1` by default).
    lookup: &'static str,
    want: Want,
}

impl Default for Case {
    fn default() -> Self {
        Case {
            name: "",
            hosts: Vec::new(),
            machines: Vec::new(),
            nodes: vec![node("w1")],
            lookup: "w1",
            want: Want::Refused("HostNotReferenced", &[]),
        }
    }
}

fn check(name: &str, got: hostcycle_core::binding::Resolution, want: &Want) -> Option<String> {
    match (&got, want) {
        (Ok(b), Want::Host(h, rule)) if &b.host == h && b.link.code() == *rule => None,
        (Err(refusal), Want::Refused(reason, words)) if refusal.reason() == *reason => {
            let text = refusal.to_string();
            let missing: Vec<&&str> = words.iter().filter(|w| !text.contains(**w)).collect();
            (!missing.is_empty())
                .then(|| format!("case {name:?}: refusal {text:?} does not say {missing:?}"))
        }
        _ => Some(format!("case {name:?}: want {want:?}, got {got:?}")),
    }
}

fn run(cases: Vec<Case>) {
    let mut failures = Vec::new();
    for c in cases {
        let index = BindingIndex::new(c.hosts.clone(), c.machines.clone(), c.nodes.clone());
        failures.extend(check(c.name, index.node(c.lookup), &c.want));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn each_authoritative_rule_binds_the_node() {
    let m3m = key("Metal3Machine", "capi", "w1-m3m");
    run(vec![
        Case {
            name: "Machine with nodeRef + metal3.io/BareMetalHost annotation",
            machines: vec![machine("m1", "w1").host_annotation("metal/bmh-1")],
            hosts: vec![host("metal", "bmh-1")],
            want: Want::Host(r("metal", "bmh-1"), "MachineAnnotation"),
            ..Default::default()
        },
        Case {
            name: "a bare name in the Machine's annotation is in the Machine's namespace",
            machines: vec![machine("m1", "w1").host_annotation("bmh-1")],
            hosts: vec![host("capi", "bmh-1"), host("metal", "bmh-1")],
            want: Want::Host(r("capi", "bmh-1"), "MachineAnnotation"),
            ..Default::default()
        },
        Case {
            name: "Machine → infrastructureRef (Metal3Machine) → the host consuming it (CAPM3)",
            machines: vec![machine("m1", "w1").infrastructure(m3m.clone())],
            hosts: vec![host("capi", "bmh-9").consumed_by(m3m.clone())],
            want: Want::Host(r("capi", "bmh-9"), "ConsumerRef"),
            ..Default::default()
        },
        Case {
            name: "the Machine itself as the host's consumerRef (OpenShift)",
            machines: vec![machine("worker-0-abc", "w1").namespace("openshift-machine-api")],
            hosts: vec![host("openshift-machine-api", "worker-0").consumed_by(key(
                "Machine",
                "openshift-machine-api",
                "worker-0-abc",
            ))],
            want: Want::Host(r("openshift-machine-api", "worker-0"), "ConsumerRef"),
            ..Default::default()
        },
        Case {
            // Alone it is a hint (see `uid_less_provider_ids_are_hints`); with the Machine's
            // links naming the same host it is one of the agreeing links.
            name: "CAPM3 provider ID metal3://<namespace>/<host>/<metal3machine> with its Machine",
            nodes: vec![node("w1").provider_id("metal3://capi/bmh-2/w1-m3m")],
            machines: vec![machine("m1", "w1").infrastructure(m3m.clone())],
            hosts: vec![host("capi", "bmh-2").consumed_by(m3m.clone())],
            want: Want::Host(r("capi", "bmh-2"), "ConsumerRef"),
            ..Default::default()
        },
        Case {
            name: "old CAPM3 provider ID metal3://<host-uid>",
            nodes: vec![node("w1").provider_id("metal3://4b1c-77e0")],
            hosts: vec![host("rack-b", "bmh-3").uid("4b1c-77e0")],
            want: Want::Host(r("rack-b", "bmh-3"), "ProviderID"),
            ..Default::default()
        },
        Case {
            name: "OpenShift provider ID baremetalhost:///<namespace>/<name>/<uid>, uid matching",
            nodes: vec![
                node("w1").provider_id("baremetalhost:///openshift-machine-api/worker-0/6a5e"),
            ],
            hosts: vec![host("openshift-machine-api", "worker-0").uid("6a5e")],
            want: Want::Host(r("openshift-machine-api", "worker-0"), "ProviderID"),
            ..Default::default()
        },
        Case {
            name: "whitespace around the provider ID is ignored",
            nodes: vec![node("w1").provider_id(" baremetalhost:///metal/bmh-2/uid-metal-bmh-2 \n")],
            hosts: vec![host("metal", "bmh-2")],
            want: Want::Host(r("metal", "bmh-2"), "ProviderID"),
            ..Default::default()
        },
        Case {
            name: "links that agree: the Machine's annotation is reported",
            machines: vec![
                machine("m1", "w1")
                    .host_annotation("metal/bmh-1")
                    .infrastructure(m3m.clone()),
            ],
            nodes: vec![node("w1").provider_id("metal3://metal/bmh-1/w1-m3m")],
            hosts: vec![host("metal", "bmh-1").consumed_by(m3m.clone())],
            want: Want::Host(r("metal", "bmh-1"), "MachineAnnotation"),
            ..Default::default()
        },
        Case {
            name: "the Node object may be gone: its Machine still binds the host",
            nodes: vec![],
            machines: vec![machine("m1", "w1").infrastructure(m3m.clone())],
            hosts: vec![host("capi", "bmh-9").consumed_by(m3m.clone())],
            want: Want::Host(r("capi", "bmh-9"), "ConsumerRef"),
            ..Default::default()
        },
    ]);
    assert_eq!(MACHINE_HOST_ANNOTATION, "metal3.io/BareMetalHost");
}

#[test]
fn hints_bind_only_when_nothing_authoritative_exists_and_nobody_else_claims_the_host() {
    run(vec![
        Case {
            name: "the Node annotation names a free host",
            nodes: vec![node("w1").annotated("rack-a/bmh-17")],
            hosts: vec![host("rack-a", "bmh-17")],
            want: Want::Host(r("rack-a", "bmh-17"), "NodeAnnotation"),
            ..Default::default()
        },
        Case {
            name: "whitespace around the annotation is ignored",
            nodes: vec![node("w1").annotated("  rack-a/bmh-17\n")],
            hosts: vec![host("rack-a", "bmh-17")],
            want: Want::Host(r("rack-a", "bmh-17"), "NodeAnnotation"),
            ..Default::default()
        },
        Case {
            name: "the only host named like the node, in any namespace",
            hosts: vec![host("rack-z", "w1"), host("metal", "w2")],
            want: Want::Host(r("rack-z", "w1"), "SameName"),
            ..Default::default()
        },
        Case {
            name: "an annotation without a namespace is no hint (same name is used)",
            nodes: vec![node("w1").annotated("bmh-17")],
            hosts: vec![host("rack-a", "bmh-17"), host("metal", "w1")],
            want: Want::Host(r("metal", "w1"), "SameName"),
            ..Default::default()
        },
        Case {
            name: "an annotation with too many parts is no hint",
            nodes: vec![node("w1").annotated("a/b/c")],
            hosts: vec![host("metal", "w1")],
            want: Want::Host(r("metal", "w1"), "SameName"),
            ..Default::default()
        },
        Case {
            name: "forged: the annotation names another node's same-name host → both refused",
            nodes: vec![node("w1").annotated("metal/w0"), node("w0")],
            hosts: vec![host("metal", "w0"), host("metal", "w1")],
            want: Want::Refused("HostBindingConflict", &["metal/w1", "metal/w0"]),
            ..Default::default()
        },
        Case {
            name: "forged, seen from the victim: w0's own same-name host is claimed twice",
            nodes: vec![node("w1").annotated("metal/w0"), node("w0")],
            hosts: vec![host("metal", "w0")],
            lookup: "w0",
            want: Want::Refused("HostBindingConflict", &["metal/w0", "node w1", "node w0"]),
            ..Default::default()
        },
        Case {
            name: "a hint naming a host a Machine links (annotation) → refused, naming both",
            nodes: vec![node("w1").annotated("metal/w0"), node("w0")],
            machines: vec![machine("m0", "w0").host_annotation("metal/w0")],
            hosts: vec![host("metal", "w0")],
            want: Want::Refused(
                "HostBindingConflict",
                &["metal/w0", "node w1", "Machine capi/m0"],
            ),
            ..Default::default()
        },
        Case {
            name: "a same-name host consumed by another Machine is not this node's",
            hosts: vec![host("metal", "w1").consumed_by(key(
                "Metal3Machine",
                "metal",
                "other-m3m",
            ))],
            want: Want::Refused(
                "HostBindingConflict",
                &["metal/w1", "Metal3Machine metal/other-m3m"],
            ),
            ..Default::default()
        },
        Case {
            name: "a hint naming a host another node's provider ID names → refused",
            nodes: vec![
                node("w1").annotated("metal/bmh-5"),
                node("w5").provider_id("metal3://metal/bmh-5/m"),
            ],
            hosts: vec![host("metal", "bmh-5")],
            want: Want::Refused("HostBindingConflict", &["metal/bmh-5", "node w5"]),
            ..Default::default()
        },
        Case {
            name: "the annotation and the same-name host disagree → refused, naming both",
            nodes: vec![node("w1").annotated("rack-a/bmh-17")],
            hosts: vec![host("rack-a", "bmh-17"), host("metal", "w1")],
            want: Want::Refused("HostBindingConflict", &["rack-a/bmh-17", "metal/w1"]),
            ..Default::default()
        },
        Case {
            name: "the annotation names a missing host → refused (not the same-name host)",
            nodes: vec![node("w1").annotated("rack-a/gone")],
            hosts: vec![host("metal", "w2")],
            want: Want::Refused("HostNotFound", &["rack-a/gone"]),
            ..Default::default()
        },
        Case {
            name: "two hosts named like the node in different namespaces → ambiguous",
            hosts: vec![host("rack-a", "w1"), host("rack-b", "w1")],
            want: Want::Refused("HostNotReferenced", &["rack-a/w1", "rack-b/w1"]),
            ..Default::default()
        },
        Case {
            name: "nothing at all → no host",
            hosts: vec![host("metal", "w2")],
            want: Want::Refused("HostNotReferenced", &["node w1"]),
            ..Default::default()
        },
        Case {
            name: "a provider ID of another kind is no link (same name is used)",
            nodes: vec![node("w1").provider_id("aws:///us-east-1a/i-0abc")],
            hosts: vec![host("metal", "w1")],
            want: Want::Host(r("metal", "w1"), "SameName"),
            ..Default::default()
        },
    ]);
}

#[test]
fn authoritative_links_override_hints_and_a_contrary_annotation_is_reported() {
    // Scenario of the seams issue: Node w1 annotated with w0's host; w1's Machine names w1's.
    let index = BindingIndex::new(
        vec![host("default", "w0"), host("default", "w1")],
        vec![
            machine("m1", "w1").host_annotation("default/w1"),
            machine("m0", "w0").host_annotation("default/w0"),
        ],
        vec![node("w1").annotated("default/w0"), node("w0")],
    );
    let b = index.node("w1").unwrap();
    assert_eq!(b.host, r("default", "w1"));
    assert_eq!(b.link.code(), "MachineAnnotation");
    let (ignored, link) = b.ignored_hint.expect("the forged annotation is reported");
    assert_eq!(ignored, r("default", "w0"));
    assert!(matches!(link, Link::NodeAnnotation { .. }));
    let b0 = index.node("w0").unwrap();
    assert_eq!(b0.host, r("default", "w0"), "w0 keeps its host");
    assert_eq!(b0.ignored_hint, None);
    // The same through the Machine, the forged annotation reported too.
    let bm = index.machine(&key("Machine", "capi", "m1")).unwrap();
    assert_eq!(bm.host, r("default", "w1"));
    assert_eq!(
        bm.ignored_hint.map(|(h, _)| h),
        Some(r("default", "w0")),
        "reported through the Machine too"
    );
    // A same-name host other than the bound one is not a "contrary annotation".
    let index = BindingIndex::new(
        vec![host("default", "w1"), host("rack", "bmh-7")],
        vec![machine("m1", "w1").host_annotation("rack/bmh-7")],
        vec![node("w1")],
    );
    let b = index.node("w1").unwrap();
    assert_eq!((b.host, b.ignored_hint), (r("rack", "bmh-7"), None));
}

#[test]
fn sources_that_disagree_refuse_naming_both_candidates() {
    let m3m = key("Metal3Machine", "capi", "w1-m3m");
    run(vec![
        Case {
            name: "Machine annotation vs. consumerRef of its infrastructure",
            machines: vec![
                machine("m1", "w1")
                    .host_annotation("metal/a")
                    .infrastructure(m3m.clone()),
            ],
            hosts: vec![
                host("metal", "a"),
                host("capi", "b").consumed_by(m3m.clone()),
            ],
            want: Want::Refused("HostBindingConflict", &["metal/a", "capi/b"]),
            ..Default::default()
        },
        Case {
            name: "Machine annotation naming a missing host vs. a consumerRef → conflict, not a fallback",
            machines: vec![
                machine("m1", "w1")
                    .host_annotation("metal/gone")
                    .infrastructure(m3m.clone()),
            ],
            hosts: vec![host("capi", "b").consumed_by(m3m.clone())],
            want: Want::Refused("HostBindingConflict", &["metal/gone", "capi/b"]),
            ..Default::default()
        },
        Case {
            // A uid-less provider ID against the annotation is a hint ignored: see
            // `uid_less_provider_ids_are_hints`.
            name: "provider ID with the host's uid vs. the Machine's annotation",
            nodes: vec![node("w1").provider_id("baremetalhost:///metal/p/uid-metal-p")],
            machines: vec![machine("m1", "w1").host_annotation("metal/a")],
            hosts: vec![host("metal", "p"), host("metal", "a")],
            want: Want::Refused("HostBindingConflict", &["metal/p", "metal/a"]),
            ..Default::default()
        },
        Case {
            name: "old CAPM3 provider ID metal3://<host-uid> vs. the Machine's annotation",
            nodes: vec![node("w1").provider_id("metal3://uid-metal-p")],
            machines: vec![machine("m1", "w1").host_annotation("metal/a")],
            hosts: vec![host("metal", "p"), host("metal", "a")],
            want: Want::Refused("HostBindingConflict", &["metal/p", "metal/a"]),
            ..Default::default()
        },
        Case {
            name: "two Machines of one node naming different hosts",
            machines: vec![
                machine("m1", "w1").host_annotation("metal/a"),
                machine("m2", "w1").host_annotation("metal/b"),
            ],
            hosts: vec![host("metal", "a"), host("metal", "b")],
            want: Want::Refused("HostBindingConflict", &["metal/a", "metal/b"]),
            ..Default::default()
        },
        Case {
            name: "two hosts consuming one Metal3Machine",
            machines: vec![machine("m1", "w1").infrastructure(m3m.clone())],
            hosts: vec![
                host("capi", "a").consumed_by(m3m.clone()),
                host("capi", "b").consumed_by(m3m.clone()),
            ],
            want: Want::Refused("HostBindingConflict", &["capi/a", "capi/b"]),
            ..Default::default()
        },
    ]);
}

#[test]
fn a_link_to_a_missing_or_replaced_host_is_refused() {
    run(vec![
        Case {
            name: "CAPM3 provider ID naming a missing host (no same-name fallback)",
            nodes: vec![node("w1").provider_id("metal3://metal/gone/m")],
            hosts: vec![host("metal", "w1")],
            want: Want::Refused("HostNotFound", &["metal/gone", "providerID"]),
            ..Default::default()
        },
        Case {
            name: "the Machine's annotation naming a missing host",
            machines: vec![machine("m1", "w1").host_annotation("metal/gone")],
            hosts: vec![host("metal", "w1")],
            want: Want::Refused("HostNotFound", &["metal/gone", "Machine capi/m1"]),
            ..Default::default()
        },
        Case {
            name: "OpenShift provider ID whose uid is not the host's: replaced under the same name",
            nodes: vec![
                node("w1").provider_id("baremetalhost:///openshift-machine-api/worker-0/old-uid"),
            ],
            hosts: vec![host("openshift-machine-api", "worker-0").uid("new-uid")],
            want: Want::Refused(
                "HostReplaced",
                &["openshift-machine-api/worker-0", "old-uid"],
            ),
            ..Default::default()
        },
        Case {
            name: "old CAPM3 provider ID with a uid no host has",
            nodes: vec![node("w1").provider_id("metal3://no-such-uid")],
            hosts: vec![host("metal", "w1")],
            want: Want::Refused("HostReplaced", &["no-such-uid"]),
            ..Default::default()
        },
        Case {
            name: "metal3:// with nothing after it is no link, and never matches an empty uid",
            nodes: vec![node("x").provider_id("metal3://")],
            lookup: "x",
            hosts: vec![host("metal", "blank").uid("")],
            want: Want::Refused("HostNotReferenced", &[]),
            ..Default::default()
        },
    ]);
}

#[test]
fn two_nodes_or_machines_on_one_host_are_refused() {
    run(vec![
        Case {
            name: "two nodes' provider IDs name one host",
            nodes: vec![
                node("w1").provider_id("metal3://metal/h/m1"),
                node("w2").provider_id("metal3://metal/h/m2"),
            ],
            hosts: vec![host("metal", "h")],
            want: Want::Refused("HostBindingConflict", &["metal/h", "node w2"]),
            ..Default::default()
        },
        Case {
            name: "two Machines of two nodes name one host",
            machines: vec![
                machine("m1", "w1").host_annotation("metal/h"),
                machine("m2", "w2").host_annotation("metal/h"),
            ],
            hosts: vec![host("metal", "h")],
            want: Want::Refused("HostBindingConflict", &["metal/h", "Machine capi/m2"]),
            ..Default::default()
        },
        Case {
            name: "the node's provider ID names a host another Machine consumes",
            nodes: vec![node("w1").provider_id("metal3://metal/h/m")],
            machines: vec![machine("m9", "w9")],
            hosts: vec![host("metal", "h").consumed_by(key("Machine", "capi", "m9"))],
            want: Want::Refused("HostBindingConflict", &["metal/h", "Machine capi/m9"]),
            ..Default::default()
        },
        Case {
            name: "a Machine without a node yet that names the host is a claimant too",
            nodes: vec![node("w1").provider_id("metal3://metal/h/m")],
            machines: vec![machine("fresh", "-").no_node().host_annotation("metal/h")],
            hosts: vec![host("metal", "h")],
            want: Want::Refused("HostBindingConflict", &["metal/h", "Machine capi/fresh"]),
            ..Default::default()
        },
        Case {
            // Uid-less, so a hint; but the Metal3Machine it names is the host's own consumer.
            name: "a consumer this operator cannot map does not outvote the node's provider ID",
            nodes: vec![node("w1").provider_id("metal3://metal/h/w1-m3m")],
            hosts: vec![host("metal", "h").consumed_by(key("Metal3Machine", "metal", "w1-m3m"))],
            want: Want::Host(r("metal", "h"), "ProviderIDHint"),
            ..Default::default()
        },
    ]);
}

#[test]
fn namespaces_are_part_of_every_link() {
    let m3m = key("Metal3Machine", "capi", "w1-m3m");
    run(vec![
        Case {
            name: "a consumerRef of another kind, namespace or name does not match",
            machines: vec![machine("m1", "w1").infrastructure(m3m.clone())],
            hosts: vec![
                host("rack-c", "a").consumed_by(key("Metal3Machine", "other", "w1-m3m")),
                host("rack-c", "b").consumed_by(key("Metal3Machine", "capi", "w2-m3m")),
                host("rack-c", "c").consumed_by(key("Machine", "capi", "w1-m3m")),
            ],
            want: Want::Refused("HostNotReferenced", &[]),
            ..Default::default()
        },
        Case {
            name: "a Machine annotation may name a host in another namespace explicitly",
            machines: vec![machine("m1", "w1").host_annotation("rack/bmh")],
            hosts: vec![host("rack", "bmh"), host("capi", "bmh")],
            want: Want::Host(r("rack", "bmh"), "MachineAnnotation"),
            ..Default::default()
        },
        Case {
            name: "a same-named host in another namespace does not satisfy a bare Machine annotation",
            machines: vec![machine("m1", "w1").host_annotation("bmh")],
            hosts: vec![host("rack", "bmh")],
            want: Want::Refused("HostNotFound", &["capi/bmh"]),
            ..Default::default()
        },
        Case {
            name: "a Machine of another node is ignored",
            machines: vec![machine("m2", "w2").host_annotation("metal/by-machine")],
            hosts: vec![host("metal", "by-machine"), host("metal", "w1")],
            want: Want::Host(r("metal", "w1"), "SameName"),
            ..Default::default()
        },
    ]);
}

/// A uid-less provider ID (`metal3://<namespace>/<host>/<x>`, `baremetalhost:///<ns>/<host>`)
/// is written by whoever registers or edits the Node: alone it is a hint, used only for a host
/// nobody else claims; it never outvotes, captures or blocks an authoritative link.
#[test]
fn uid_less_provider_ids_are_hints() {
    let m3m = key("Metal3Machine", "capi", "w1-m3m");
    run(vec![
        Case {
            name: "alone, for an unclaimed host: bound as a hint",
            nodes: vec![node("w1").provider_id("metal3://metal/bmh-2/w1-m3m-x2")],
            hosts: vec![host("metal", "bmh-2")],
            want: Want::Host(r("metal", "bmh-2"), "ProviderIDHint"),
            ..Default::default()
        },
        Case {
            name: "alone, whitespace around it ignored",
            nodes: vec![node("w1").provider_id(" metal3://metal/bmh-2/m \n")],
            hosts: vec![host("metal", "bmh-2")],
            want: Want::Host(r("metal", "bmh-2"), "ProviderIDHint"),
            ..Default::default()
        },
        Case {
            name: "OpenShift's form without a uid is a hint too",
            nodes: vec![node("w1").provider_id("baremetalhost:///openshift-machine-api/worker-0")],
            hosts: vec![host("openshift-machine-api", "worker-0")],
            want: Want::Host(r("openshift-machine-api", "worker-0"), "ProviderIDHint"),
            ..Default::default()
        },
        Case {
            name: "naming host B while the node's Machine names host A → A",
            nodes: vec![node("w1").provider_id("metal3://metal/b/m")],
            machines: vec![machine("m1", "w1").host_annotation("metal/a")],
            hosts: vec![host("metal", "a"), host("metal", "b")],
            want: Want::Host(r("metal", "a"), "MachineAnnotation"),
            ..Default::default()
        },
        Case {
            name: "naming host B while the host consuming the Machine's Metal3Machine is A → A",
            nodes: vec![node("w1").provider_id("metal3://capi/b/w1-m3m")],
            machines: vec![machine("m1", "w1").infrastructure(m3m.clone())],
            hosts: vec![
                host("capi", "a").consumed_by(m3m.clone()),
                host("capi", "b"),
            ],
            want: Want::Host(r("capi", "a"), "ConsumerRef"),
            ..Default::default()
        },
        Case {
            name: "for a host another node's Machine names → not bound",
            nodes: vec![node("w1").provider_id("metal3://metal/h/x"), node("w0")],
            machines: vec![machine("m0", "w0").host_annotation("metal/h")],
            hosts: vec![host("metal", "h")],
            want: Want::Refused("HostBindingConflict", &["metal/h", "Machine capi/m0"]),
            ..Default::default()
        },
        Case {
            name: "for a host another node's provider ID with its uid names → not bound",
            nodes: vec![
                node("w1").provider_id("metal3://metal/h/x"),
                node("w0").provider_id("metal3://uid-metal-h"),
            ],
            hosts: vec![host("metal", "h")],
            want: Want::Refused("HostBindingConflict", &["metal/h", "node w0"]),
            ..Default::default()
        },
        Case {
            name: "for a host another node's hint names (its same-name host) → not bound",
            nodes: vec![node("w1").provider_id("metal3://metal/w0/x"), node("w0")],
            hosts: vec![host("metal", "w0")],
            want: Want::Refused("HostBindingConflict", &["metal/w0", "node w0"]),
            ..Default::default()
        },
        Case {
            name: "the victim keeps its host: another node's forged provider ID blocks nothing",
            nodes: vec![node("w1").provider_id("metal3://metal/h/x"), node("w0")],
            machines: vec![machine("m0", "w0").host_annotation("metal/h")],
            hosts: vec![host("metal", "h")],
            lookup: "w0",
            want: Want::Host(r("metal", "h"), "MachineAnnotation"),
        },
        Case {
            name: "the victim bound by its provider ID with the uid keeps its host too",
            nodes: vec![
                node("w1").provider_id("metal3://metal/h/x"),
                node("w0").provider_id("metal3://uid-metal-h"),
            ],
            hosts: vec![host("metal", "h")],
            lookup: "w0",
            want: Want::Host(r("metal", "h"), "ProviderID"),
            ..Default::default()
        },
        Case {
            name: "a provider ID naming another consumer than the host's Metal3Machine → not bound",
            nodes: vec![node("w1").provider_id("metal3://metal/h/w1-m3m")],
            hosts: vec![host("metal", "h").consumed_by(key("Metal3Machine", "metal", "w9-m3m"))],
            want: Want::Refused(
                "HostBindingConflict",
                &["metal/h", "Metal3Machine metal/w9-m3m"],
            ),
            ..Default::default()
        },
        Case {
            name: "the provider ID and the Node's annotation disagree → refused, naming both",
            nodes: vec![
                node("w1")
                    .provider_id("metal3://metal/a/m")
                    .annotated("metal/b"),
            ],
            hosts: vec![host("metal", "a"), host("metal", "b")],
            want: Want::Refused("HostBindingConflict", &["metal/a", "metal/b"]),
            ..Default::default()
        },
        Case {
            name: "the provider ID and the same-name host disagree → refused, naming both",
            nodes: vec![node("w1").provider_id("metal3://metal/a/m")],
            hosts: vec![host("metal", "a"), host("rack", "w1")],
            want: Want::Refused("HostBindingConflict", &["metal/a", "rack/w1"]),
            ..Default::default()
        },
        Case {
            name: "the provider ID and the same-name host agree → the provider ID is reported",
            nodes: vec![node("w1").provider_id("metal3://metal/w1/m")],
            hosts: vec![host("metal", "w1")],
            want: Want::Host(r("metal", "w1"), "ProviderIDHint"),
            ..Default::default()
        },
    ]);
}

/// A uid-less provider ID contrary to the node's Machine is reported (a Warning), through the
/// node and the Machine; one that agrees is an authoritative link and claims the host for its
/// node.
#[test]
fn a_contrary_provider_id_is_reported_and_an_agreeing_one_is_a_link() {
    let m3m = key("Metal3Machine", "capi", "w1-m3m");
    let index = BindingIndex::new(
        vec![host("metal", "a"), host("metal", "b")],
        vec![machine("m1", "w1").host_annotation("metal/a")],
        vec![node("w1").provider_id("metal3://metal/b/m")],
    );
    for binding in [
        index.node("w1").unwrap(),
        index.machine(&key("Machine", "capi", "m1")).unwrap(),
    ] {
        let (ignored, link) = binding
            .ignored_hint
            .expect("the contrary provider ID is reported");
        assert_eq!(ignored, r("metal", "b"));
        assert_eq!(link.code(), "ProviderIDHint");
        assert!(!link.authoritative());
        assert!(link.to_string().contains("metal3://metal/b/m"), "{link}");
    }
    assert!(
        index.claims(&r("metal", "b")).is_empty(),
        "a hint claims nothing"
    );

    let index = BindingIndex::new(
        vec![host("capi", "bmh-2").consumed_by(m3m.clone())],
        vec![machine("m1", "w1").infrastructure(m3m.clone())],
        vec![node("w1").provider_id("metal3://capi/bmh-2/w1-m3m")],
    );
    let b = index.node("w1").unwrap();
    assert_eq!(b.ignored_hint, None);
    let claimants: Vec<(Claimant, &str)> = index
        .claims(&r("capi", "bmh-2"))
        .iter()
        .map(|(c, l)| (c.clone(), l.code()))
        .collect();
    assert_eq!(
        claimants,
        vec![
            (
                Claimant::Machine(key("Machine", "capi", "m1")),
                "ConsumerRef"
            ),
            (Claimant::Node("w1".into()), "ProviderID"),
        ]
    );
}

/// `spec.consumerRef` is written by whoever may edit the host: it links a Machine only in the
/// host's own namespace, and a disagreement with the Machine's own annotation is a conflict.
#[test]
fn consumer_refs_link_only_machines_of_the_hosts_namespace() {
    let theirs = key("Machine", "capi", "m1");
    let their_m3m = key("Metal3Machine", "capi", "w1-m3m");
    run(vec![
        Case {
            name: "a consumerRef naming another namespace's Machine → ignored (no capture)",
            machines: vec![machine("m1", "w1")],
            hosts: vec![host("evil", "h").consumed_by(theirs.clone())],
            want: Want::Refused("HostNotReferenced", &["node w1"]),
            ..Default::default()
        },
        Case {
            name: "a consumerRef naming another namespace's Metal3Machine → ignored (no capture)",
            machines: vec![machine("m1", "w1").infrastructure(their_m3m.clone())],
            hosts: vec![host("evil", "h").consumed_by(their_m3m.clone())],
            want: Want::Refused("HostNotReferenced", &["node w1"]),
            ..Default::default()
        },
        Case {
            name: "a consumerRef from another namespace never blocks the Machine's own host",
            machines: vec![machine("m1", "w1").host_annotation("capi/real")],
            hosts: vec![
                host("capi", "real"),
                host("evil", "h").consumed_by(theirs.clone()),
            ],
            want: Want::Host(r("capi", "real"), "MachineAnnotation"),
            ..Default::default()
        },
        Case {
            name: "nor the host consuming the Machine's Metal3Machine in its namespace",
            machines: vec![machine("m1", "w1").infrastructure(their_m3m.clone())],
            hosts: vec![
                host("capi", "real").consumed_by(their_m3m.clone()),
                host("evil", "h").consumed_by(their_m3m.clone()),
            ],
            want: Want::Host(r("capi", "real"), "ConsumerRef"),
            ..Default::default()
        },
        Case {
            name: "an infrastructureRef into another namespace: its hosts there are not the Machine's",
            machines: vec![machine("m1", "w1").infrastructure(key("Metal3Machine", "rack", "x"))],
            hosts: vec![host("rack", "h").consumed_by(key("Metal3Machine", "rack", "x"))],
            want: Want::Refused("HostNotReferenced", &["node w1"]),
            ..Default::default()
        },
        Case {
            name: "a cross-namespace consumerRef still keeps hints off its own host",
            machines: vec![machine("m1", "w9")],
            hosts: vec![host("evil", "w1").consumed_by(theirs.clone())],
            want: Want::Refused("HostBindingConflict", &["evil/w1", "Machine capi/m1"]),
            ..Default::default()
        },
        Case {
            name: "a same-namespace consumerRef contradicting the Machine's annotation → conflict",
            machines: vec![machine("m1", "w1").host_annotation("capi/a")],
            hosts: vec![
                host("capi", "a"),
                host("capi", "b").consumed_by(theirs.clone()),
            ],
            want: Want::Refused("HostBindingConflict", &["capi/a", "capi/b", "consumerRef"]),
            ..Default::default()
        },
        Case {
            name: "a same-namespace consumerRef agreeing with the Machine's annotation",
            machines: vec![machine("m1", "w1").host_annotation("capi/a")],
            hosts: vec![host("capi", "a").consumed_by(theirs.clone())],
            want: Want::Host(r("capi", "a"), "MachineAnnotation"),
            ..Default::default()
        },
    ]);

    // Looked up by Machine: the same answers.
    let index = BindingIndex::new(
        vec![host("evil", "h").consumed_by(theirs.clone())],
        vec![machine("m1", "w1")],
        vec![node("w1")],
    );
    assert_eq!(
        index.machine(&theirs).unwrap_err().reason(),
        "HostNotReferenced"
    );
    assert_eq!(
        index.claims(&r("evil", "h")),
        &[(
            Claimant::Object(theirs.clone()),
            Link::ConsumerRef {
                machine: theirs.clone(),
                consumer: theirs.clone(),
            }
        )],
        "the host is taken, by an object that is no Machine of its namespace"
    );
    let index = BindingIndex::new(
        vec![
            host("capi", "a"),
            host("capi", "b").consumed_by(theirs.clone()),
        ],
        vec![machine("m1", "w1").host_annotation("capi/a")],
        vec![node("w1")],
    );
    let refusal = index.machine(&theirs).unwrap_err();
    assert_eq!(refusal.reason(), "HostBindingConflict");
    assert!(refusal.is_conflict());
}

#[test]
fn a_machine_resolves_through_its_own_links_then_its_node() {
    let m3m = key("Metal3Machine", "capi", "w1-m3m");
    let index = BindingIndex::new(
        vec![
            host("capi", "bmh-9").consumed_by(m3m.clone()),
            host("metal", "w2"),
            host("metal", "w3"),
        ],
        vec![
            machine("m1", "w1").infrastructure(m3m.clone()),
            machine("m2", "w2"),
            machine("m3", "w3"),
            machine("m4", "-").no_node(),
        ],
        vec![node("w2"), node("w3").provider_id("metal3://metal/w3/x")],
    );
    let got = |name: &str| index.machine(&key("Machine", "capi", name));
    // A CAPI Machine without the host annotation: the host is its Metal3Machine's consumer,
    // with or without a Node.
    assert_eq!(got("m1").unwrap().host, r("capi", "bmh-9"));
    // No link of its own: its Node's hint.
    assert_eq!(got("m2").unwrap().link.code(), "SameName");
    // Its Node's provider ID (uid-less, with no link of the Machine's to agree: a hint).
    assert_eq!(got("m3").unwrap().link.code(), "ProviderIDHint");
    // No link and no node.
    assert_eq!(got("m4").unwrap_err().reason(), "HostNotReferenced");
    // A Machine the index does not know.
    assert_eq!(got("m9").unwrap_err().reason(), "HostNotReferenced");
    // Who claims bmh-9: the Machine, through its Metal3Machine.
    assert_eq!(
        index
            .claims(&r("capi", "bmh-9"))
            .iter()
            .map(|(c, _)| c.clone())
            .collect::<Vec<_>>(),
        vec![Claimant::Machine(key("Machine", "capi", "m1"))]
    );
}

#[test]
fn host_references_parse_strictly() {
    #[rustfmt::skip]
    let cases: Vec<(&str, Option<&str>, Option<HostReference>)> = vec![
        ("ns/name", None, Some(r("ns", "name"))),
        (" ns/name\n", None, Some(r("ns", "name"))),
        ("name", None, None),
        ("name", Some("dflt"), Some(r("dflt", "name"))),
        ("ns/", Some("dflt"), None),
        ("/name", None, None),
        ("a/b/c", Some("dflt"), None),
        ("", Some("dflt"), None),
        // Only Kubernetes names: a forged annotation names no host and is never echoed.
        ("ns/host-0.rack-1", None, Some(r("ns", "host-0.rack-1"))),
        ("NS/name", None, None),
        ("ns/Name", None, None),
        ("ns/-name", None, None),
        ("ns/na me", None, None),
        ("ns.x/name", None, None),
        ("ns/name\u{0}", None, None),
    ];
    let long_name = format!("ns/{}", "a".repeat(254));
    assert_eq!(parse_host_ref(&long_name, None), None);
    assert!(parse_host_ref(&format!("ns/{}", "a".repeat(253)), None).is_some());
    assert_eq!(parse_host_ref(&format!("{}/n", "a".repeat(64)), None), None);
    assert_eq!(parse_host_ref(&"x".repeat(256 * 1024), Some("dflt")), None);
    for (text, default, want) in cases {
        assert_eq!(
            parse_host_ref(text, default),
            want,
            "{text:?} with {default:?}"
        );
    }
    let facts = NodeFacts::new(
        "w1",
        Some("metal3://x"),
        &BTreeMap::from([(NODE_HOST_ANNOTATION.to_string(), "ns/h".to_string())]),
    );
    assert_eq!(facts.host_annotation.as_deref(), Some("ns/h"));
}

#[test]
fn the_queue_reboots_through_the_bound_host_if_it_is_usable() {
    let paused = "is paused (baremetalhost.metal3.io/paused)";
    let unusable = |h: &HostReference| (h.name == "p").then(|| paused.to_string());
    #[rustfmt::skip]
    let cases: Vec<(&str, Vec<NodeFacts>, Vec<HostFacts>, RebootTarget)> = vec![
        ("usable host → Host", vec![node("w1")], vec![host("metal", "w1")], RebootTarget::Host(r("metal", "w1"))),
        ("paused host → UnusableHost", vec![node("w1").provider_id("metal3://metal/p/m")], vec![host("metal", "p")],
            RebootTarget::UnusableHost { host: r("metal", "p"), why: paused.into() }),
        ("nothing → NoHost", vec![node("w1")], vec![host("metal", "w2")], RebootTarget::NoHost),
    ];
    for (name, nodes, hosts, want) in cases {
        let index = BindingIndex::new(hosts, vec![], nodes);
        assert_eq!(reboot_target(&index, "w1", unusable), want, "{name}");
    }
    // A doubtful binding is refused with its reason, never rebooted.
    let index = BindingIndex::new(
        vec![host("metal", "w0"), host("metal", "w1")],
        vec![],
        vec![node("w1").annotated("metal/w0"), node("w0")],
    );
    match reboot_target(&index, "w1", unusable) {
        RebootTarget::Refused { why } => assert!(why.contains("metal/w0"), "{why}"),
        other => panic!("want Refused, got {other:?}"),
    }
}

/// A case of `nodes_of_host`: name, hosts, Machines, Nodes, and the nodes bound to `metal/h0`.
type NodesOfHostCase = (
    &'static str,
    Vec<HostFacts>,
    Vec<MachineFacts>,
    Vec<NodeFacts>,
    Vec<&'static str>,
);

/// The nodes bound to a host (a held-off host's node counts as away for the queue): through a
/// Machine whose Node is gone, a provider ID, a hint; never a node whose binding is refused or
/// names another host.
#[test]
fn nodes_of_host_are_the_nodes_that_resolve_to_it() {
    let names = |index: &BindingIndex, h: &HostReference| -> Vec<String> {
        index.nodes_of_host(h).into_iter().collect()
    };
    #[rustfmt::skip]
    let cases: Vec<NodesOfHostCase> = vec![
        ("a Machine's annotation, its Node gone: the nodeRef", vec![host("metal", "h0")],
            vec![machine("m0", "cp-0").host_annotation("metal/h0")], vec![], vec!["cp-0"]),
        ("a consumerRef naming the Machine", vec![host("metal", "h0").consumed_by(key("Machine", "metal", "m0"))],
            vec![machine("m0", "w0").namespace("metal")], vec![node("w0")], vec!["w0"]),
        ("a consumerRef naming another namespace's Machine: none", vec![host("metal", "h0").consumed_by(key("Machine", "capi", "m0"))],
            vec![machine("m0", "w0")], vec![node("w0")], vec![]),
        ("a provider ID", vec![host("metal", "h0")], vec![],
            vec![node("w0").provider_id("metal3://metal/h0/m")], vec!["w0"]),
        ("the same-name hint", vec![host("metal", "h0")], vec![], vec![node("h0")], vec!["h0"]),
        ("the Node's annotation (a hint)", vec![host("metal", "h0")], vec![],
            vec![node("w0").annotated("metal/h0")], vec!["w0"]),
        ("no link, no hint: none", vec![host("metal", "h0")], vec![], vec![node("w0")], vec![]),
        ("two Machines claim it: refused, none", vec![host("metal", "h0")],
            vec![machine("m0", "w0").host_annotation("metal/h0"), machine("m1", "w1").host_annotation("metal/h0")],
            vec![node("w0"), node("w1")], vec![]),
        ("the node's own link names another host: not this one", vec![host("metal", "h0"), host("metal", "h1")],
            vec![machine("m0", "w0").host_annotation("metal/h1")], vec![node("w0").annotated("metal/h0")], vec![]),
    ];
    for (name, hosts, machines, nodes, want) in cases {
        let index = BindingIndex::new(hosts, machines, nodes);
        assert_eq!(names(&index, &r("metal", "h0")), want, "{name}");
    }
}
