//! What the reboot queue reads from API objects: `QueueNodeView::from_node`,
//! `EntryView::from_entry` and `QueueSnapshot::from_objects`, from realistic JSON.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hostcycle_api::queue::{
    CORDONED_BY_ANNOTATION, EntryPhase, HostReference, RebootMethod, RebootQueue, RebootQueueEntry,
};
use hostcycle_core::queue::{
    CONTROL_PLANE_LABEL, EntryView, MASTER_LABEL, QueueConfig, QueueNodeView, QueueSnapshot,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

fn ts(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn node_info(boot_id: &str) -> Value {
    json!({
        "architecture": "amd64",
        "bootID": boot_id,
        "containerRuntimeVersion": "containerd://1.7.24",
        "kernelVersion": "6.1.0-28-amd64",
        "kubeProxyVersion": "",
        "kubeletVersion": "v1.33.1",
        "machineID": "0c7f2c5e1b9a4d0c9e3f6a1b2c3d4e5f",
        "operatingSystem": "linux",
        "osImage": "Debian GNU/Linux 12 (bookworm)",
        "systemUUID": "4c4c4544-0042-3510-8051-b4c04f563332"
    })
}

/// A Ready worker as a kubelet reports it.
fn worker_json() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "w1",
            "uid": "a3c0d2a4-3b8e-4f0e-9d57-0b6f1f0d7a11",
            "resourceVersion": "48213",
            "labels": {
                "kubernetes.io/hostname": "w1",
                "kubernetes.io/os": "linux",
                "node-role.kubernetes.io/worker": ""
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"
            }
        },
        "spec": { "podCIDR": "10.244.1.0/24", "providerID": "metal3://metal/w1/w1-m3m" },
        "status": {
            "addresses": [
                { "type": "Hostname", "address": "w1" },
                { "type": "ExternalIP", "address": "203.0.113.11" },
                { "type": "InternalIP", "address": "10.0.0.11" }
            ],
            "conditions": [
                { "type": "MemoryPressure", "status": "False",
                  "lastHeartbeatTime": "2025-06-15T14:05:00Z",
                  "lastTransitionTime": "2025-06-01T00:00:00Z",
                  "reason": "KubeletHasSufficientMemory", "message": "ok" },
                { "type": "Ready", "status": "True",
                  "lastHeartbeatTime": "2025-06-15T14:04:30Z",
                  "lastTransitionTime": "2025-06-01T00:00:00Z",
                  "reason": "KubeletReady", "message": "kubelet is posting ready status" }
            ],
            "nodeInfo": node_info("7c1d9a52-3c4e-4d0b-9b39-3f4b0c6a2e10"),
            "volumesInUse": [
                "kubernetes.io/csi/rbd.csi.ceph.com^0001-0009-rook-ceph-0000000000000002-aa",
                "kubernetes.io/csi/rbd.csi.ceph.com^0001-0009-rook-ceph-0000000000000002-bb"
            ]
        }
    })
}

/// A change to a Node's JSON.
type Edit = Box<dyn FnOnce(&mut Value)>;

/// `worker_json()` with `f` applied.
fn node_with(f: impl FnOnce(&mut Value)) -> QueueNodeView {
    let mut v = worker_json();
    f(&mut v);
    let node: Node = serde_json::from_value(v).unwrap();
    QueueNodeView::from_node(&node)
}

fn ready_condition(v: &mut Value) -> &mut Value {
    v["status"]["conditions"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c["type"] == "Ready")
        .unwrap()
}

#[test]
fn a_ready_worker_reads_fully() {
    let n = node_with(|_| {});
    assert_eq!(
        n,
        QueueNodeView {
            name: "w1".into(),
            api_server: false,
            ready: true,
            ready_heartbeat: Some(ts("2025-06-15T14:04:30Z")),
            boot_id: Some("7c1d9a52-3c4e-4d0b-9b39-3f4b0c6a2e10".into()),
            unschedulable: false,
            cordoned_by_queue: false,
            volumes_in_use: 2,
            address: "10.0.0.11".into(),
            reported_addresses: vec!["10.0.0.11".into(), "203.0.113.11".into(), "w1".into()],
        }
    );
}

#[test]
fn ready_only_when_the_ready_condition_is_true() {
    #[rustfmt::skip]
    let cases: Vec<(&str, Edit, bool)> = vec![
        ("True", Box::new(|_| {}), true),
        ("False", Box::new(|v| ready_condition(v)["status"] = json!("False")), false),
        ("Unknown (node controller lost the kubelet)", Box::new(|v| ready_condition(v)["status"] = json!("Unknown")), false),
        ("lowercase true is not True", Box::new(|v| ready_condition(v)["status"] = json!("true")), false),
        ("no Ready condition", Box::new(|v| {
            v["status"]["conditions"].as_array_mut().unwrap().retain(|c| c["type"] != "Ready");
        }), false),
        ("no conditions", Box::new(|v| { v["status"].as_object_mut().unwrap().remove("conditions"); }), false),
        ("no status", Box::new(|v| { v.as_object_mut().unwrap().remove("status"); }), false),
    ];
    for (name, f, want) in cases {
        assert_eq!(node_with(f).ready, want, "{name}");
    }
}

#[test]
fn heartbeat_is_the_ready_conditions_own() {
    // The Ready condition's heartbeat, not another condition's (MemoryPressure is later).
    assert_eq!(
        node_with(|_| {}).ready_heartbeat,
        Some(ts("2025-06-15T14:04:30Z"))
    );
    // Kept when the node is not Ready: the boot check compares it to the power-on.
    let n = node_with(|v| {
        let c = ready_condition(v);
        c["status"] = json!("Unknown");
        c["lastHeartbeatTime"] = json!("2025-06-15T13:00:00Z");
    });
    assert_eq!(n.ready_heartbeat, Some(ts("2025-06-15T13:00:00Z")));
    let n = node_with(|v| {
        ready_condition(v)
            .as_object_mut()
            .unwrap()
            .remove("lastHeartbeatTime");
    });
    assert_eq!(n.ready_heartbeat, None);
    let n = node_with(|v| {
        v["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .retain(|c| c["type"] != "Ready");
    });
    assert_eq!(n.ready_heartbeat, None, "no Ready condition, no heartbeat");
}

#[test]
fn boot_id_reads_empty_as_none() {
    #[rustfmt::skip]
    let cases: Vec<(&str, Edit, Option<&str>)> = vec![
        ("set", Box::new(|_| {}), Some("7c1d9a52-3c4e-4d0b-9b39-3f4b0c6a2e10")),
        ("empty", Box::new(|v| v["status"]["nodeInfo"]["bootID"] = json!("")), None),
        ("blank", Box::new(|v| v["status"]["nodeInfo"]["bootID"] = json!("  ")), None),
        ("padded", Box::new(|v| v["status"]["nodeInfo"]["bootID"] = json!(" b-2 \n")), Some("b-2")),
        ("no nodeInfo", Box::new(|v| { v["status"].as_object_mut().unwrap().remove("nodeInfo"); }), None),
    ];
    for (name, f, want) in cases {
        assert_eq!(node_with(f).boot_id.as_deref(), want, "{name}");
    }
}

#[test]
fn address_prefers_internal_ip_then_external_ip_then_hostname_then_the_name() {
    let addresses = |list: Value| move |v: &mut Value| v["status"]["addresses"] = list;
    #[rustfmt::skip]
    let cases: Vec<(&str, Value, &str)> = vec![
        ("InternalIP first whatever the order", json!([
            { "type": "Hostname", "address": "w1.lab" },
            { "type": "ExternalIP", "address": "203.0.113.11" },
            { "type": "InternalIP", "address": "10.0.0.11" }]), "10.0.0.11"),
        ("ExternalIP without InternalIP", json!([
            { "type": "Hostname", "address": "w1.lab" },
            { "type": "ExternalIP", "address": "203.0.113.11" }]), "203.0.113.11"),
        ("Hostname alone", json!([{ "type": "Hostname", "address": "w1.lab" }]), "w1.lab"),
        ("no addresses → the node name", json!([]), "w1"),
        ("an empty InternalIP is skipped", json!([
            { "type": "InternalIP", "address": "  " },
            { "type": "ExternalIP", "address": "203.0.113.11" }]), "203.0.113.11"),
        ("the first InternalIP of several", json!([
            { "type": "InternalIP", "address": "10.0.0.11" },
            { "type": "InternalIP", "address": "fd00::11" }]), "10.0.0.11"),
        ("whitespace is trimmed", json!([{ "type": "InternalIP", "address": " 10.0.0.11\n" }]), "10.0.0.11"),
        ("unknown address types are ignored", json!([{ "type": "InternalDNS", "address": "w1.internal" }]), "w1"),
    ];
    for (name, list, want) in cases {
        assert_eq!(node_with(addresses(list)).address, want, "{name}");
    }
    let n = node_with(|v| {
        v["status"].as_object_mut().unwrap().remove("addresses");
    });
    assert_eq!(n.address, "w1", "no addresses field");
}

/// Every InternalIP, ExternalIP and Hostname a Node reports is kept: no other node's commands
/// may get one of them. Empty ones and the DNS types (a DNS server may hand a name to several
/// machines) are not.
#[test]
fn reported_addresses_are_the_kubelets_address_types() {
    let n = node_with(|v| {
        v["status"]["addresses"] = json!([
            { "type": "Hostname", "address": "w1.lab" },
            { "type": "InternalDNS", "address": "w1.internal" },
            { "type": "ExternalIP", "address": " 203.0.113.11 " },
            { "type": "InternalIP", "address": "10.0.0.11" },
            { "type": "InternalIP", "address": "" },
            { "type": "InternalIP", "address": "fd00::11" }
        ]);
    });
    assert_eq!(
        n.reported_addresses,
        ["10.0.0.11", "fd00::11", "203.0.113.11", "w1.lab"]
    );
    assert_eq!(n.address, "10.0.0.11");
    let n = node_with(|v| v["status"]["addresses"] = json!([]));
    assert!(n.reported_addresses.is_empty());
    assert_eq!(n.address, "w1");
}

#[test]
fn control_plane_and_master_labels_mark_api_servers() {
    let label = |key: &'static str, value: &'static str| {
        move |v: &mut Value| v["metadata"]["labels"][key] = json!(value)
    };
    assert!(!node_with(|_| {}).api_server, "worker label");
    assert!(node_with(label(CONTROL_PLANE_LABEL, "")).api_server);
    assert!(node_with(label(MASTER_LABEL, "")).api_server);
    assert!(
        node_with(label(MASTER_LABEL, "true")).api_server,
        "the value does not matter"
    );
    assert!(
        !node_with(label("node-role.kubernetes.io/control-plane-x", "")).api_server,
        "only the exact key"
    );
    let n = node_with(|v| {
        v["metadata"].as_object_mut().unwrap().remove("labels");
    });
    assert!(!n.api_server, "no labels");
    assert_eq!(CONTROL_PLANE_LABEL, "node-role.kubernetes.io/control-plane");
    assert_eq!(MASTER_LABEL, "node-role.kubernetes.io/master");
}

#[test]
fn cordon_by_the_queue_is_the_annotation_not_the_unschedulable_flag() {
    let n = node_with(|v| {
        v["spec"]["unschedulable"] = json!(true);
        v["metadata"]["annotations"][CORDONED_BY_ANNOTATION] = json!("rqe-0000000007");
    });
    assert!(n.unschedulable && n.cordoned_by_queue);

    let n = node_with(|v| v["spec"]["unschedulable"] = json!(true));
    assert!(n.unschedulable, "an administrator's cordon");
    assert!(!n.cordoned_by_queue);

    let n = node_with(|v| {
        v["metadata"]["annotations"][CORDONED_BY_ANNOTATION] = json!("");
    });
    assert!(
        n.cordoned_by_queue && !n.unschedulable,
        "the annotation alone (someone uncordoned by hand)"
    );

    let n = node_with(|v| {
        v["metadata"].as_object_mut().unwrap().remove("annotations");
        v.as_object_mut().unwrap().remove("spec");
    });
    assert!(!n.cordoned_by_queue && !n.unschedulable);
    assert_eq!(
        CORDONED_BY_ANNOTATION,
        "hostcycle.io/cordoned-by-reboot-queue"
    );
}

#[test]
fn volumes_in_use_are_counted() {
    assert_eq!(node_with(|_| {}).volumes_in_use, 2);
    let n = node_with(|v| v["status"]["volumesInUse"] = json!([]));
    assert_eq!(n.volumes_in_use, 0);
    let n = node_with(|v| {
        v["status"].as_object_mut().unwrap().remove("volumesInUse");
    });
    assert_eq!(n.volumes_in_use, 0);
}

// ---------------------------------------------------------------------------------------
// Entries.

fn entry_json(status: Option<Value>) -> RebootQueueEntry {
    let mut v = json!({
        "apiVersion": "hostcycle.io/v1alpha1",
        "kind": "RebootQueueEntry",
        "metadata": {
            "name": "rqe-0000000007",
            "uid": "5d0f6c1e-8a1f-4e55-9a0d-2b0e8e0f7c31",
            "creationTimestamp": "2025-06-15T13:00:00Z"
        },
        "spec": { "node": "w1", "index": 7 }
    });
    if let Some(status) = status {
        v["status"] = status;
    }
    serde_json::from_value(v).unwrap()
}

#[test]
fn an_entry_without_status_is_queued() {
    let e = EntryView::from_entry(&entry_json(None));
    assert_eq!(
        e,
        EntryView {
            name: "rqe-0000000007".into(),
            uid: Some("5d0f6c1e-8a1f-4e55-9a0d-2b0e8e0f7c31".into()),
            node: "w1".into(),
            index: 7,
            cancel: false,
            phase: EntryPhase::Queued,
            last_transition: None,
            backoff_count: 0,
            backoff_expire: None,
            last_drain_failure: None,
            reboot: None,
            boot_timed_out: false,
            message: String::new(),
        }
    );
    let r = e.reference();
    assert_eq!(
        (r.name.as_str(), r.index, r.node.as_str()),
        ("rqe-0000000007", 7, "w1")
    );
}

#[test]
fn an_entry_status_reads_fully() {
    let e = EntryView::from_entry(&entry_json(Some(json!({
        "phase": "Rebooting",
        "lastTransitionTime": "2025-06-15T14:00:00.25Z",
        "drainBackoffCount": 2,
        "drainBackoffExpire": "2025-06-15T13:50:00Z",
        "message": "rebooting: waiting for host metal/w1 to power off and on",
        "reboot": {
            "method": "BMC",
            "host": { "namespace": "metal", "name": "w1" },
            "bootId": "7c1d9a52",
            "requestedAt": "2025-06-15T14:00:01Z"
        },
        "conditions": [
            { "type": "BootTimedOut", "status": "True", "reason": "BootNotConfirmed",
              "message": "no boot after 1800s", "lastTransitionTime": "2025-06-15T14:30:00Z" }
        ]
    }))));
    assert_eq!(e.phase, EntryPhase::Rebooting);
    assert_eq!(e.last_transition, Some(ts("2025-06-15T14:00:00.25Z")));
    assert_eq!(e.backoff_count, 2);
    assert_eq!(e.backoff_expire, Some(ts("2025-06-15T13:50:00Z")));
    assert!(e.message.contains("power off and on"));
    assert!(e.boot_timed_out);
    let reboot = e.reboot.unwrap();
    assert_eq!(reboot.method, RebootMethod::Bmc);
    assert_eq!(
        reboot.host,
        Some(HostReference {
            namespace: "metal".into(),
            name: "w1".into()
        })
    );
    assert_eq!(reboot.boot_id.as_deref(), Some("7c1d9a52"));
    assert_eq!(reboot.requested_at, Some(ts("2025-06-15T14:00:01Z")));
}

#[test]
fn entry_phase_boot_timeout_and_backoff_edges() {
    let with = |status: Value| EntryView::from_entry(&entry_json(Some(status)));
    assert_eq!(
        with(json!({ "phase": "Paused" })).phase,
        EntryPhase::Queued,
        "an unknown phase reads as Queued"
    );
    assert_eq!(
        with(json!({ "phase": "Draining" })).phase,
        EntryPhase::Draining
    );
    let false_condition = with(json!({ "conditions": [
        { "type": "BootTimedOut", "status": "False", "reason": "Booted",
          "message": "", "lastTransitionTime": "2025-06-15T14:30:00Z" }
    ]}));
    assert!(!false_condition.boot_timed_out);
    let other_condition = with(json!({ "conditions": [
        { "type": "Other", "status": "True", "reason": "X",
          "message": "", "lastTransitionTime": "2025-06-15T14:30:00Z" }
    ]}));
    assert!(!other_condition.boot_timed_out);

    let backed =
        with(json!({ "drainBackoffCount": 1, "drainBackoffExpire": "2025-06-15T14:00:00Z" }));
    assert!(backed.backed_off(ts("2025-06-15T13:59:59Z")));
    assert!(
        !backed.backed_off(ts("2025-06-15T14:00:00Z")),
        "expired at the instant"
    );
    assert!(!backed.backed_off(ts("2025-06-15T14:00:01Z")));

    let cancelled: RebootQueueEntry = serde_json::from_value(json!({
        "apiVersion": "hostcycle.io/v1alpha1",
        "kind": "RebootQueueEntry",
        "metadata": { "name": "by-hand" },
        "spec": { "node": "w2", "index": 12, "cancel": true }
    }))
    .unwrap();
    let e = EntryView::from_entry(&cancelled);
    assert!(e.cancel);
    assert_eq!(
        (e.name.as_str(), e.uid.as_deref(), e.index),
        ("by-hand", None, 12)
    );
}

// ---------------------------------------------------------------------------------------
// Whole snapshots.

#[test]
fn from_objects_without_a_reboot_queue_uses_the_defaults() {
    let worker: Node = serde_json::from_value(worker_json()).unwrap();
    let mut cp = worker_json();
    cp["metadata"]["name"] = json!("cp1");
    cp["metadata"]["labels"][CONTROL_PLANE_LABEL] = json!("");
    let cp: Node = serde_json::from_value(cp).unwrap();
    let entries = vec![
        RebootQueueEntry::for_node("w1", 1),
        RebootQueueEntry::for_node("cp1", 2),
    ];

    let s = QueueSnapshot::from_objects(None, &[worker, cp], &entries);
    assert_eq!(s.config, QueueConfig::default());
    assert!(s.config.enabled);
    assert_eq!(s.config.max_concurrent_reboots, 1);
    assert_eq!(s.config.max_unreachable_nodes, 0);
    assert_eq!(
        s.nodes.keys().map(String::as_str).collect::<Vec<_>>(),
        vec!["cp1", "w1"]
    );
    assert!(s.nodes["cp1"].api_server);
    assert!(!s.nodes["w1"].api_server);
    assert_eq!(
        s.entries
            .iter()
            .map(|e| (e.name.as_str(), e.index, e.node.as_str(), e.phase))
            .collect::<Vec<_>>(),
        vec![
            ("rqe-0000000001", 1, "w1", EntryPhase::Queued),
            ("rqe-0000000002", 2, "cp1", EntryPhase::Queued),
        ]
    );
    assert!(s.reboot_targets.is_empty(), "left for the controller");

    let empty = QueueSnapshot::from_objects(None, &[], &[]);
    assert_eq!(empty, QueueSnapshot::default());
}

#[test]
fn from_objects_resolves_the_queues_spec() {
    let queue: RebootQueue = serde_json::from_value(json!({
        "apiVersion": "hostcycle.io/v1alpha1",
        "kind": "RebootQueue",
        "metadata": { "name": "default" },
        "spec": {
            "enabled": false,
            "maxConcurrentReboots": 3,
            "maxUnreachableNodes": 1,
            "reboot": { "method": "Command", "rebootCommand": ["/usr/local/bin/reboot-node"],
                        "bootCheckCommand": ["/usr/local/bin/booted"] }
        }
    }))
    .unwrap();
    let s = QueueSnapshot::from_objects(Some(&queue), &[], &[]);
    assert_eq!(s.config, QueueConfig::from_spec(&queue.spec));
    assert!(!s.config.enabled);
    assert_eq!(s.config.max_concurrent_reboots, 3);
    assert_eq!(s.config.max_unreachable_nodes, 1);
    assert_eq!(s.config.reboot.method, Some(RebootMethod::Command));
}
