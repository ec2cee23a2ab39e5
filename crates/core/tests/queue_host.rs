//! How a Node finds its BareMetalHost (`find_host`) and what the queue can reboot it with
//! (`reboot_target`), as tables. First match wins: the node's annotation, its provider ID,
//! a Machine, a unique host of the same name.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use hostcycle_api::queue::{HostReference, NODE_HOST_ANNOTATION};
use hostcycle_core::queue::RebootTarget;
use hostcycle_core::queue::host::{
    HostMatch, HostSummary, MACHINE_HOST_ANNOTATION, MachineSummary, NodeIdentity, ObjectKey,
    find_host, reboot_target,
};

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

/// A usable host without a consumer.
fn host(namespace: &str, name: &str) -> HostSummary {
    HostSummary {
        reference: r(namespace, name),
        uid: format!("uid-{namespace}-{name}"),
        consumer: None,
        unusable: None,
    }
}

trait HostBuild {
    fn uid(self, uid: &str) -> Self;
    fn consumed_by(self, consumer: ObjectKey) -> Self;
    fn unusable(self, why: &str) -> Self;
}

impl HostBuild for HostSummary {
    fn uid(mut self, uid: &str) -> Self {
        self.uid = uid.into();
        self
    }
    fn consumed_by(mut self, consumer: ObjectKey) -> Self {
        self.consumer = Some(consumer);
        self
    }
    fn unusable(mut self, why: &str) -> Self {
        self.unusable = Some(why.into());
        self
    }
}

fn node(name: &str) -> NodeIdentity {
    NodeIdentity {
        name: name.into(),
        provider_id: None,
        annotations: BTreeMap::new(),
    }
}

trait NodeBuild {
    fn provider_id(self, id: &str) -> Self;
    fn annotated(self, value: &str) -> Self;
}

impl NodeBuild for NodeIdentity {
    fn provider_id(mut self, id: &str) -> Self {
        self.provider_id = Some(id.into());
        self
    }
    fn annotated(mut self, value: &str) -> Self {
        self.annotations
            .insert(NODE_HOST_ANNOTATION.into(), value.into());
        self
    }
}

/// A CAPI Machine (namespace `capi`) whose nodeRef is `node`.
fn machine(name: &str, node: &str) -> MachineSummary {
    MachineSummary {
        key: key("Machine", "capi", name),
        node_name: Some(node.into()),
        host_annotation: None,
        infrastructure: None,
    }
}

trait MachineBuild {
    fn host_annotation(self, value: &str) -> Self;
    fn infrastructure(self, infra: ObjectKey) -> Self;
    fn kind(self, kind: &str, namespace: &str) -> Self;
}

impl MachineBuild for MachineSummary {
    fn host_annotation(mut self, value: &str) -> Self {
        self.host_annotation = Some(value.into());
        self
    }
    fn infrastructure(mut self, infra: ObjectKey) -> Self {
        self.infrastructure = Some(infra);
        self
    }
    fn kind(mut self, kind: &str, namespace: &str) -> Self {
        self.key.kind = kind.into();
        self.key.namespace = namespace.into();
        self
    }
}

struct Case {
    name: &'static str,
    node: NodeIdentity,
    hosts: Vec<HostSummary>,
    machines: Vec<MachineSummary>,
    want: Option<(HostReference, HostMatch)>,
}

impl Default for Case {
    fn default() -> Self {
        Case {
            name: "",
            node: node("w1"),
            hosts: Vec::new(),
            machines: Vec::new(),
            want: None,
        }
    }
}

fn run(cases: Vec<Case>) {
    let mut failures = Vec::new();
    for c in cases {
        let got = find_host(&c.node, &c.hosts, &c.machines);
        if got != c.want {
            failures.push(format!(
                "case {:?}: want {:?}, got {:?}",
                c.name, c.want, got
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Decoys every rule would find if it were asked first.
fn decoys() -> Vec<HostSummary> {
    vec![
        host("metal", "w1"),
        host("metal", "by-provider"),
        host("metal", "by-machine"),
    ]
}

#[test]
fn the_node_annotation_comes_first_even_naming_a_missing_host() {
    run(vec![
        Case {
            name: "annotation names an existing host",
            node: node("w1").annotated("rack-a/bmh-17"),
            hosts: vec![host("rack-a", "bmh-17")],
            want: Some((r("rack-a", "bmh-17"), HostMatch::Annotation)),
            ..Default::default()
        },
        Case {
            name: "annotation wins over provider ID, Machine and same name",
            node: node("w1")
                .annotated("rack-a/bmh-17")
                .provider_id("metal3://metal/by-provider/m3m"),
            hosts: [decoys(), vec![host("rack-a", "bmh-17")]].concat(),
            machines: vec![machine("m1", "w1").host_annotation("metal/by-machine")],
            want: Some((r("rack-a", "bmh-17"), HostMatch::Annotation)),
        },
        Case {
            name: "annotation naming a missing host is still authoritative",
            node: node("w1")
                .annotated("rack-a/gone")
                .provider_id("metal3://metal/by-provider/m3m"),
            hosts: decoys(),
            want: Some((r("rack-a", "gone"), HostMatch::Annotation)),
            ..Default::default()
        },
        Case {
            name: "whitespace around the annotation is ignored",
            node: node("w1").annotated("  rack-a/bmh-17\n"),
            hosts: vec![host("rack-a", "bmh-17")],
            want: Some((r("rack-a", "bmh-17"), HostMatch::Annotation)),
            ..Default::default()
        },
        Case {
            name: "an annotation without a namespace is ignored (falls through to same name)",
            node: node("w1").annotated("bmh-17"),
            hosts: vec![host("rack-a", "bmh-17"), host("metal", "w1")],
            want: Some((r("metal", "w1"), HostMatch::SameName)),
            ..Default::default()
        },
        Case {
            name: "an annotation with an empty part is ignored",
            node: node("w1").annotated("rack-a/"),
            hosts: vec![host("metal", "w1")],
            want: Some((r("metal", "w1"), HostMatch::SameName)),
            ..Default::default()
        },
        Case {
            name: "an annotation with too many parts is ignored",
            node: node("w1").annotated("a/b/c"),
            hosts: vec![host("metal", "w1")],
            want: Some((r("metal", "w1"), HostMatch::SameName)),
            ..Default::default()
        },
    ]);
}

#[test]
fn provider_ids_of_capm3_old_capm3_and_openshift_name_the_host() {
    run(vec![
        Case {
            name: "CAPM3 metal3://<namespace>/<host>/<metal3machine>",
            node: node("w1").provider_id("metal3://metal/by-provider/w1-m3m-x2"),
            hosts: decoys(),
            want: Some((r("metal", "by-provider"), HostMatch::ProviderId)),
            ..Default::default()
        },
        Case {
            name: "CAPM3 form naming a host that does not exist falls through",
            node: node("w1").provider_id("metal3://metal/gone/w1-m3m-x2"),
            hosts: decoys(),
            want: Some((r("metal", "w1"), HostMatch::SameName)),
            ..Default::default()
        },
        Case {
            name: "old CAPM3 metal3://<host-uid>",
            node: node("w1").provider_id("metal3://4b1c-77e0"),
            hosts: [decoys(), vec![host("rack-b", "bmh-3").uid("4b1c-77e0")]].concat(),
            want: Some((r("rack-b", "bmh-3"), HostMatch::ProviderId)),
            ..Default::default()
        },
        Case {
            name: "old CAPM3 with an unknown uid falls through",
            node: node("w1").provider_id("metal3://no-such-uid"),
            hosts: decoys(),
            want: Some((r("metal", "w1"), HostMatch::SameName)),
            ..Default::default()
        },
        Case {
            name: "metal3:// with nothing after it never matches a host with an empty uid",
            node: node("x").provider_id("metal3://"),
            hosts: vec![host("metal", "blank").uid("")],
            want: None,
            ..Default::default()
        },
        Case {
            name: "OpenShift baremetalhost:///<namespace>/<name>/<uid>",
            node: node("w1").provider_id(
                "baremetalhost:///openshift-machine-api/worker-0/6a5e1d3f-0b9e-4f2e-8c1a-1d2e3f4a5b6c",
            ),
            hosts: [decoys(), vec![host("openshift-machine-api", "worker-0")]].concat(),
            want: Some((r("openshift-machine-api", "worker-0"), HostMatch::ProviderId)),
            ..Default::default()
        },
        Case {
            name: "whitespace around the provider ID is ignored",
            node: node("w1").provider_id(" metal3://metal/by-provider/m \n"),
            hosts: decoys(),
            want: Some((r("metal", "by-provider"), HostMatch::ProviderId)),
            ..Default::default()
        },
        Case {
            name: "a provider ID of another kind is ignored",
            node: node("w1").provider_id("aws:///us-east-1a/i-0abc"),
            hosts: decoys(),
            want: Some((r("metal", "w1"), HostMatch::SameName)),
            ..Default::default()
        },
        Case {
            name: "provider ID wins over a Machine",
            node: node("w1").provider_id("metal3://metal/by-provider/m"),
            hosts: decoys(),
            machines: vec![machine("m1", "w1").host_annotation("metal/by-machine")],
            want: Some((r("metal", "by-provider"), HostMatch::ProviderId)),
        },
    ]);
}

#[test]
fn a_machine_whose_node_ref_is_the_node_leads_to_its_host() {
    let m3m = key("Metal3Machine", "capi", "w1-m3m");
    run(vec![
        Case {
            name: "Machine with nodeRef + metal3.io/BareMetalHost annotation",
            machines: vec![machine("m1", "w1").host_annotation("metal/by-machine")],
            hosts: decoys(),
            want: Some((r("metal", "by-machine"), HostMatch::Machine)),
            ..Default::default()
        },
        Case {
            name: "Machine → infrastructureRef (Metal3Machine) → the host it consumes",
            machines: vec![machine("m1", "w1").infrastructure(m3m.clone())],
            hosts: [
                decoys(),
                vec![host("rack-c", "bmh-9").consumed_by(m3m.clone())],
            ]
            .concat(),
            want: Some((r("rack-c", "bmh-9"), HostMatch::Machine)),
            ..Default::default()
        },
        Case {
            name: "Machine as the host's consumerRef directly (OpenShift)",
            machines: vec![machine("worker-0-abc", "w1").kind("Machine", "openshift-machine-api")],
            hosts: [
                decoys(),
                vec![host("openshift-machine-api", "worker-0").consumed_by(key(
                    "Machine",
                    "openshift-machine-api",
                    "worker-0-abc",
                ))],
            ]
            .concat(),
            want: Some((r("openshift-machine-api", "worker-0"), HostMatch::Machine)),
            ..Default::default()
        },
        Case {
            name: "Machine annotation naming a missing host falls back to the consumerRef",
            machines: vec![
                machine("m1", "w1")
                    .host_annotation("metal/gone")
                    .infrastructure(m3m.clone()),
            ],
            hosts: [
                decoys(),
                vec![host("rack-c", "bmh-9").consumed_by(m3m.clone())],
            ]
            .concat(),
            want: Some((r("rack-c", "bmh-9"), HostMatch::Machine)),
            ..Default::default()
        },
        Case {
            name: "a consumerRef of another kind, namespace or name does not match",
            machines: vec![machine("m1", "w1").infrastructure(m3m.clone())],
            hosts: vec![
                host("rack-c", "a").consumed_by(key("Metal3Machine", "other", "w1-m3m")),
                host("rack-c", "b").consumed_by(key("Metal3Machine", "capi", "w2-m3m")),
                host("rack-c", "c").consumed_by(key("Machine", "capi", "w1-m3m")),
                host("metal", "w1"),
            ],
            want: Some((r("metal", "w1"), HostMatch::SameName)),
            ..Default::default()
        },
        Case {
            name: "a Machine of another node is ignored",
            machines: vec![
                machine("m2", "w2").host_annotation("metal/by-machine"),
                MachineSummary {
                    node_name: None,
                    ..machine("m3", "w1").host_annotation("metal/by-machine")
                },
            ],
            hosts: decoys(),
            want: Some((r("metal", "w1"), HostMatch::SameName)),
            ..Default::default()
        },
        Case {
            name: "Machine wins over the same-name fallback",
            machines: vec![machine("m1", "w1").host_annotation("metal/by-machine")],
            hosts: decoys(),
            want: Some((r("metal", "by-machine"), HostMatch::Machine)),
            ..Default::default()
        },
    ]);
    assert_eq!(MACHINE_HOST_ANNOTATION, "metal3.io/BareMetalHost");
}

#[test]
fn same_name_fallback_only_when_unique_across_namespaces() {
    run(vec![
        Case {
            name: "one host named like the node, in any namespace",
            hosts: vec![host("rack-z", "w1"), host("metal", "w2")],
            want: Some((r("rack-z", "w1"), HostMatch::SameName)),
            ..Default::default()
        },
        Case {
            name: "two hosts named like the node in different namespaces → none",
            hosts: vec![host("rack-a", "w1"), host("rack-b", "w1")],
            want: None,
            ..Default::default()
        },
        Case {
            name: "nothing at all → none",
            hosts: vec![host("metal", "w2")],
            want: None,
            ..Default::default()
        },
        Case {
            name: "no hosts → none",
            want: None,
            ..Default::default()
        },
    ]);
}

#[test]
fn reboot_target_is_the_host_unless_it_is_missing_or_unusable() {
    let paused = "is paused (baremetalhost.metal3.io/paused)";
    let detached = "is detached (baremetalhost.metal3.io/detached)";
    let offline = "is offline (spec.online: false); it would not power back on";
    #[rustfmt::skip]
    let cases: Vec<(&str, NodeIdentity, Vec<HostSummary>, RebootTarget)> = vec![
        ("usable host → Host", node("w1"), vec![host("metal", "w1")], RebootTarget::Host(r("metal", "w1"))),
        ("paused host → UnusableHost", node("w1"), vec![host("metal", "w1").unusable(paused)],
            RebootTarget::UnusableHost { host: r("metal", "w1"), why: paused.into() }),
        ("detached host → UnusableHost", node("w1"), vec![host("metal", "w1").unusable(detached)],
            RebootTarget::UnusableHost { host: r("metal", "w1"), why: detached.into() }),
        ("offline host → UnusableHost", node("w1"), vec![host("metal", "w1").unusable(offline)],
            RebootTarget::UnusableHost { host: r("metal", "w1"), why: offline.into() }),
        ("annotation naming a missing host → UnusableHost saying so", node("w1").annotated("rack-a/gone"), vec![host("metal", "w1")],
            RebootTarget::UnusableHost { host: r("rack-a", "gone"),
                why: "does not exist (named by the node's hostcycle.io/baremetalhost annotation)".into() }),
        ("an unusable host found first is not skipped for a usable one", node("w1").provider_id("metal3://metal/p/m"),
            vec![host("metal", "p").unusable(paused), host("metal", "w1")],
            RebootTarget::UnusableHost { host: r("metal", "p"), why: paused.into() }),
        ("nothing → NoHost", node("w1"), vec![host("metal", "w2")], RebootTarget::NoHost),
        ("ambiguous same name → NoHost", node("w1"), vec![host("a", "w1"), host("b", "w1")], RebootTarget::NoHost),
    ];
    for (name, n, hosts, want) in cases {
        assert_eq!(reboot_target(&n, &hosts, &[]), want, "{name}");
    }
}
