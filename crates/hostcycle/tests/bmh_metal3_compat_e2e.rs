//! Clients written for metal3's baremetal-operator, end to end: real control plane,
//! sushy-tools Redfish emulator, the real operator binary. CAPM3's remediation annotation,
//! `spec.disablePowerOff` (BMC restarts, refused holds), CAPM3's deletion sequence (image
//! removed → deprovisioned), and the status fields metal3 clients read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use hostcycle_api::BareMetalHost;
use hostcycle_testkit::bmc_emulators::FakePower;
use jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject};
use serde_json::json;

/// Exactly what CAPM3's remediation controller writes.
const REMEDIATION: &str =
    "reboot.metal3.io/metal3-remediation-6f1a0b7c-3e0e-4b8a-9a3c-0d7b8a1c2e3f";
const CAPM3_VALUE: &str = r#"{"mode":"hard","force":false}"#;

fn pending(h: &BareMetalHost) -> Option<Timestamp> {
    ts(h).0
}

fn warnings(events: &[(String, String, String)]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|(t, _, _)| t == "Warning")
        .map(|(_, r, n)| (r.clone(), n.clone()))
        .collect()
}

fn condition_is(h: &BareMetalHost, type_: &str, status: &str, reason: &str) -> bool {
    h.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .is_some_and(|c| c.status == status && c.reason == reason)
}

/// The object as the API server stores it (not re-serialized by our types).
async fn raw_status(lab: &Lab, name: &str) -> serde_json::Value {
    let resource = ApiResource::erase::<BareMetalHost>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(lab.client.clone(), NS, &resource);
    let object = api.get(name).await.unwrap();
    object.data["status"].clone()
}

/// CAPM3's remediation, twice: hard, held off until CAPM3 removes its annotation, no
/// Warning; the second time a new `pendingRebootSince` and a second full cycle.
async fn capm3_remediation_twice(lab: &Lab, name: &str) {
    let mut previous: Option<Timestamp> = None;
    for round in 1..=2 {
        lab.annotate(name, REMEDIATION, CAPM3_VALUE).await;
        let host = lab
            .wait_host(name, "a new pendingRebootSince", POWER_TIMEOUT, |h| {
                pending(h).is_some_and(|p| previous.is_none_or(|q| p > q))
            })
            .await;
        let since = pending(&host).unwrap();
        lab.wait_emulator_power(name, FakePower::Off).await;
        lab.assert_power_stays(name, "Off", Duration::from_secs(3))
            .await;
        lab.unannotate(name, REMEDIATION).await;
        let host = lab.wait_reboot_done(name).await;
        assert_eq!(pending(&host), Some(since), "round {round}");
        assert!(ts(&host).1.unwrap() > since, "round {round}");
        previous = Some(since);
    }
    let history = lab.settled_history(name).await;
    assert_eq!(history.power_offs(), 2, "two full cycles: {history:?}");
    assert_eq!(history.power_ons(), 2, "two full cycles: {history:?}");
    // Events are published in the background; the second completion may still be on its way.
    lab.wait_event_count(name, "RebootCompleted", 2).await;
    let events = lab.events(name).await;
    assert_eq!(warnings(&events), vec![], "no Warning: {events:?}");
    let offs: Vec<&String> = events
        .iter()
        .filter(|(_, r, _)| r == "PowerOff")
        .map(|(_, _, n)| n)
        .collect();
    // Identical notes fold into one Event series; the power history above counts the cycles.
    assert!(!offs.is_empty(), "{events:?}");
    assert!(offs.iter().all(|n| n.starts_with("hard")), "{offs:?}");
}

/// `poweredOn` and `lastUpdated` as a metal3 client reads them from the API server.
async fn status_fields_as_stored(lab: &Lab, name: &str) {
    let before = raw_status(lab, name).await;
    assert_eq!(before["poweredOn"], json!(true), "{before}");
    let first: Timestamp = before["lastUpdated"].as_str().unwrap().parse().unwrap();
    // Off via online: false: poweredOn false is written, not omitted; lastUpdated moves.
    lab.patch_spec(name, json!({ "online": false })).await;
    lab.wait_host(name, "observed off", POWER_TIMEOUT, |h| {
        h.status.as_ref().and_then(|s| s.powered_on) == Some(false)
    })
    .await;
    let after = raw_status(lab, name).await;
    assert_eq!(after["poweredOn"], json!(false), "{after}");
    let second: Timestamp = after["lastUpdated"].as_str().unwrap().parse().unwrap();
    assert!(
        second > first,
        "lastUpdated moves with every write: {first} → {second}"
    );
    lab.patch_spec(name, json!({ "online": true })).await;
    lab.wait_emulator_power(name, FakePower::On).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capm3_remediation_annotation_and_status_fields() {
    let lab = Lab::start(&["remediated", "fields"]).await;
    tokio::join!(
        capm3_remediation_twice(&lab, "remediated"),
        status_fields_as_stored(&lab, "fields")
    );
}

/// `disablePowerOff: true`: reboots are BMC restarts (soft: GracefulRestart, hard:
/// ForceRestart), never a power-off; `online: false` and keyed holds are refused with a Warning
/// and the `PowerOffRefused` condition while the host stays on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disable_power_off_restarts_and_refuses_holds() {
    let lab = Lab::start(&["restart-soft", "restart-hard", "refuse"]).await;
    for name in ["restart-soft", "restart-hard", "refuse"] {
        lab.patch_spec(name, json!({ "disablePowerOff": true }))
            .await;
    }

    let restart = |name: &'static str, value: &'static str, mode: &'static str| {
        let lab = &lab;
        async move {
            lab.annotate(name, REBOOT, value).await;
            let host = lab.wait_reboot_done(name).await;
            let (since, powered_on) = ts(&host);
            assert!(powered_on.unwrap() > since.unwrap());
            let action = host
                .status
                .as_ref()
                .and_then(|s| s.last_power_action.clone())
                .unwrap();
            assert!(action.restart, "{action:?}");
            // Events are published in the background: wait for the two the reboot ends with.
            let events = lab
                .events_when(name, "PowerRestart and RebootCompleted", |events| {
                    ["PowerRestart", "RebootCompleted"]
                        .iter()
                        .all(|want| events.iter().any(|(_, r, _)| r == want))
                })
                .await;
            let reasons: Vec<&str> = events.iter().map(|(_, r, _)| r.as_str()).collect();
            assert!(
                !reasons.contains(&"PowerOff"),
                "never a power-off: {events:?}"
            );
            assert!(
                !reasons.contains(&"PowerOn"),
                "no separate power-on: {events:?}"
            );
            let restarts: Vec<&String> = events
                .iter()
                .filter(|(_, r, _)| r == "PowerRestart")
                .map(|(_, _, n)| n)
                .collect();
            assert_eq!(restarts.len(), 1, "{events:?}");
            assert!(restarts[0].starts_with(mode), "{restarts:?}");
            assert!(reasons.contains(&"RebootCompleted"), "{events:?}");
            assert_eq!(warnings(&events), vec![], "{events:?}");
            // sushy-tools shows a restart as a short Off; the host is back on by itself.
            lab.wait_emulator_power(name, FakePower::On).await;
            lab.assert_power_stays(name, "On", Duration::from_secs(3))
                .await;
        }
    };
    let refuse = async {
        lab.patch_spec("refuse", json!({ "online": false })).await;
        lab.wait_host("refuse", "PowerOffRefused condition", POWER_TIMEOUT, |h| {
            condition_is(h, "PowerOffRefused", "True", "PowerOffDisabled")
        })
        .await;
        lab.wait_event("refuse", "PowerOffRefused").await;
        lab.assert_power_stays("refuse", "On", Duration::from_secs(5))
            .await;

        lab.patch_spec("refuse", json!({ "online": true })).await;
        lab.annotate("refuse", REMEDIATION, CAPM3_VALUE).await;
        let host = lab
            .wait_host(
                "refuse",
                "the keyed hold named as refused",
                POWER_TIMEOUT,
                |h| {
                    h.status
                        .as_ref()
                        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "PowerOffRefused"))
                        .is_some_and(|c| c.status == "True" && c.message.contains(REMEDIATION))
                },
            )
            .await;
        assert_eq!(pending(&host), None, "a refused hold is no reboot");
        lab.assert_power_stays("refuse", "On", Duration::from_secs(5))
            .await;
        let events = lab
            .events_when(
                "refuse",
                "PowerOffRefused for online: false and the hold",
                |events| {
                    let refused = |needle: &str| {
                        events.iter().any(|(t, r, n)| {
                            t == "Warning" && r == "PowerOffRefused" && n.contains(needle)
                        })
                    };
                    refused("online: false") && refused(REMEDIATION)
                },
            )
            .await;
        let refused: Vec<&String> = events
            .iter()
            .filter(|(t, r, _)| t == "Warning" && r == "PowerOffRefused")
            .map(|(_, _, n)| n)
            .collect();
        assert!(
            refused.iter().any(|n| n.contains("online: false"))
                && refused.iter().any(|n| n.contains(REMEDIATION)),
            "{events:?}"
        );
        lab.unannotate("refuse", REMEDIATION).await;
        lab.wait_host("refuse", "nothing refused any more", POWER_TIMEOUT, |h| {
            condition_is(h, "PowerOffRefused", "False", "NothingRefused")
        })
        .await;
        let history = lab.settled_history("refuse").await;
        assert_eq!(history.power_offs(), 0, "{history:?}");
    };
    tokio::join!(
        restart("restart-soft", "", "soft"),
        restart("restart-hard", CAPM3_VALUE, "hard"),
        refuse
    );
    let metrics = lab.metrics().await;
    for needle in [
        "hostcycle_power_actions_total{action=\"restart\",mode=\"soft\",result=\"ok\"}",
        "hostcycle_power_actions_total{action=\"restart\",mode=\"hard\",result=\"ok\"}",
    ] {
        assert!(metrics.contains(needle), "{needle} missing:\n{metrics}");
    }
    assert!(
        !metrics.contains("hostcycle_power_actions_total{action=\"off\""),
        "no power-off at all:\n{metrics}"
    );
}

/// CAPM3 deleting a Metal3Machine: remove the image, set `online: false`, wait for the state to
/// leave `provisioned`, then clear `consumerRef`. The host is deprovisioned, powered off, and
/// ends `available`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capm3_deletion_sequence_deprovisions() {
    let lab = Lab::start(&["machine"]).await;
    let state = |h: &BareMetalHost| {
        h.status
            .as_ref()
            .and_then(|s| s.provisioning.state.as_ref())
            .map(|s| s.as_str().to_owned())
    };
    // CAPM3 provisioning: consumerRef, image, online.
    lab.patch_spec(
        "machine",
        json!({
            "externallyProvisioned": false,
            "consumerRef": {
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                "kind": "Metal3Machine", "name": "worker-0", "namespace": NS
            },
            "image": {
                "url": "http://172.22.0.1/images/ubuntu.qcow2",
                "checksum": "http://172.22.0.1/images/ubuntu.qcow2.sha256sum",
                "checksumType": "sha256", "format": "qcow2"
            },
            "online": true
        }),
    )
    .await;
    let host = lab
        .wait_host(
            "machine",
            "provisioned with its image",
            POWER_TIMEOUT,
            |h| {
                state(h).as_deref() == Some("provisioned")
                    && h.status
                        .as_ref()
                        .and_then(|s| s.provisioning.image_url())
                        .is_some()
            },
        )
        .await;
    assert_eq!(
        host.status.as_ref().unwrap().provisioning.image_url(),
        Some("http://172.22.0.1/images/ubuntu.qcow2")
    );
    // A fencing hold left behind by a client: deprovisioning removes it.
    lab.annotate("machine", "reboot.metal3.io/leftover", "")
        .await;
    lab.wait_emulator_power("machine", FakePower::Off).await;

    // CAPM3 Delete(): image removed and online: false in one update.
    lab.patch_spec("machine", json!({ "image": null, "online": false }))
        .await;
    let host = lab
        .wait_host("machine", "state left provisioned", POWER_TIMEOUT, |h| {
            matches!(state(h).as_deref(), Some("deprovisioning" | "available"))
        })
        .await;
    assert!(
        host.spec.consumer_ref.is_some(),
        "CAPM3 has not cleared it yet"
    );
    // CAPM3 then clears consumerRef.
    lab.patch_spec("machine", json!({ "consumerRef": null }))
        .await;
    let host = lab
        .wait_host(
            "machine",
            "available, no annotation, image record gone",
            POWER_TIMEOUT,
            |h| {
                state(h).as_deref() == Some("available")
                    && !has_reboot_annotation(h)
                    && h.status
                        .as_ref()
                        .is_some_and(|s| s.provisioning.image_url().is_none())
            },
        )
        .await;
    assert_eq!(host.status.as_ref().and_then(|s| s.powered_on), Some(false));
    lab.assert_power_stays("machine", "Off", Duration::from_secs(3))
        .await;
    let reasons = lab.event_reasons("machine").await;
    assert!(
        reasons.iter().any(|r| r == "RebootAnnotationRemoved"),
        "{reasons:?}"
    );
    // It stays available (no consumer, no image) on later reconciles.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        state(&lab.get("machine").await).as_deref(),
        Some("available")
    );
}
