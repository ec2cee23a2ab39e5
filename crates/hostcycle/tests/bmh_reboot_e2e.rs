//! The reboot API end to end: real control plane, sushy-tools Redfish emulator, the real
//! operator binary. Each test runs several scenarios at once on separate hosts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use hostcycle_testkit::bmc_emulators::FakePower;

/// The seed's guarantee: once lastPoweredOn is later than the request, the host went through
/// Off after the request (every process running at the request has stopped), exactly once.
async fn assert_single_clean_cycle(lab: &Lab, name: &str) {
    let host = lab.get(name).await;
    let (pending, powered_on) = ts(&host);
    let (pending, powered_on) = (pending.unwrap(), powered_on.unwrap());
    assert!(
        powered_on > pending,
        "{name}: lastPoweredOn {powered_on} must be after pendingRebootSince {pending}"
    );
    let history = lab.settled_history(name).await;
    assert_eq!(
        history.power_offs(),
        1,
        "{name}: exactly one power-off, history {history:?}"
    );
    assert_eq!(
        history.power_ons(),
        1,
        "{name}: exactly one power-on, history {history:?}"
    );
    assert!(
        history.off_after(pending).is_some(),
        "{name}: host must be seen Off after the request ({pending}); history {history:?}"
    );
}

fn power_off_notes(events: &[(String, String, String)]) -> Vec<String> {
    events
        .iter()
        .filter(|(_, r, _)| r == "PowerOff")
        .map(|(_, _, n)| n.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soft_hard_mixed_and_malformed_reboots() {
    let lab = Lab::start(&["soft", "hard", "mixed", "malformed"]).await;

    let soft = async {
        lab.annotate("soft", REBOOT, "").await;
        let host = lab.wait_reboot_done("soft").await;
        assert!(
            !annotations(&host).contains_key(REBOOT),
            "suffixless annotation removed by the controller"
        );
        assert_single_clean_cycle(&lab, "soft").await;
        let events = lab
            .events_when(
                "soft",
                "RebootRequested, PowerOff, RebootAnnotationRemoved, PowerOn",
                |events| {
                    [
                        "RebootRequested",
                        "PowerOff",
                        "RebootAnnotationRemoved",
                        "PowerOn",
                    ]
                    .iter()
                    .all(|want| events.iter().any(|(_, r, _)| r == want))
                },
            )
            .await;
        let offs = power_off_notes(&events);
        assert_eq!(offs.len(), 1, "one PowerOff event: {events:?}");
        assert!(offs[0].starts_with("soft"), "soft power-off: {offs:?}");
        let reasons: Vec<&str> = events.iter().map(|(_, r, _)| r.as_str()).collect();
        for reason in [
            "RebootRequested",
            "PowerOff",
            "RebootAnnotationRemoved",
            "PowerOn",
        ] {
            assert!(
                reasons.contains(&reason),
                "event {reason} missing: {reasons:?}"
            );
        }
    };
    let hard = async {
        lab.annotate("hard", REBOOT, HARD).await;
        let host = lab.wait_reboot_done("hard").await;
        assert_eq!(annotations(&host).get(REBOOT), None);
        assert_single_clean_cycle(&lab, "hard").await;
        let offs = power_off_notes(
            &lab.events_when("hard", "PowerOn", |events| {
                events.iter().any(|(_, r, _)| r == "PowerOn")
            })
            .await,
        );
        assert!(
            offs.len() == 1 && offs[0].starts_with("hard"),
            "hard power-off: {offs:?}"
        );
    };
    let mixed = async {
        // Two clients, one soft and one hard, in one write: hard wins.
        let patch = serde_json::json!({ "metadata": { "annotations": {
            "reboot.metal3.io/soft-client": r#"{"mode":"soft"}"#,
            "reboot.metal3.io/hard-client": HARD,
        }}});
        lab.hosts
            .patch(
                "mixed",
                &Default::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
        lab.wait_host("mixed", "held off", POWER_TIMEOUT, |h| {
            h.status.as_ref().and_then(|s| s.powered_on) == Some(false)
        })
        .await;
        let offs = power_off_notes(
            &lab.events_when("mixed", "PowerOff", |events| {
                events.iter().any(|(_, r, _)| r == "PowerOff")
            })
            .await,
        );
        assert!(
            offs.len() == 1 && offs[0].starts_with("hard"),
            "soft+hard → one hard power-off: {offs:?}"
        );
        lab.unannotate("mixed", "reboot.metal3.io/soft-client")
            .await;
        lab.unannotate("mixed", "reboot.metal3.io/hard-client")
            .await;
        lab.wait_reboot_done("mixed").await;
        assert_single_clean_cycle(&lab, "mixed").await;
    };
    let malformed = async {
        lab.annotate("malformed", REBOOT, "{not json").await;
        lab.wait_reboot_done("malformed").await;
        assert_single_clean_cycle(&lab, "malformed").await;
        let events = lab
            .events_when(
                "malformed",
                "InvalidRebootAnnotation and PowerOn",
                |events| {
                    ["InvalidRebootAnnotation", "PowerOn"]
                        .iter()
                        .all(|want| events.iter().any(|(_, r, _)| r == want))
                },
            )
            .await;
        assert!(
            events
                .iter()
                .any(|(t, r, _)| t == "Warning" && r == "InvalidRebootAnnotation"),
            "Warning InvalidRebootAnnotation expected: {events:?}"
        );
        let offs = power_off_notes(&events);
        assert!(
            offs.len() == 1 && offs[0].starts_with("soft"),
            "malformed value counts as soft: {offs:?}"
        );
    };
    tokio::join!(soft, hard, mixed, malformed);

    let metrics = lab.metrics().await;
    for needle in [
        "hostcycle_power_actions_total{action=\"off\",mode=\"soft\",result=\"ok\"}",
        "hostcycle_power_actions_total{action=\"off\",mode=\"hard\",result=\"ok\"}",
        "hostcycle_power_actions_total{action=\"on\",mode=\"none\",result=\"ok\"}",
        "hostcycle_reboot_duration_seconds_count",
        "hostcycle_bmc_request_duration_seconds_bucket",
        "hostcycle_hosts{operational_status=\"OK\"}",
        "hostcycle_leader 1",
    ] {
        assert!(
            metrics.contains(needle),
            "metric {needle} missing from:\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keyed_annotations_hold_the_host_off_until_every_owner_releases() {
    let lab = Lab::start(&["ab", "ba", "keyed-and-suffixless", "goes-offline"]).await;

    let release_in_order = |name: &'static str, first: &'static str, second: &'static str| {
        let lab = &lab;
        async move {
            let patch = serde_json::json!({ "metadata": { "annotations": {
                "reboot.metal3.io/a": "client a", "reboot.metal3.io/b": "client b",
            }}});
            lab.hosts
                .patch(name, &Default::default(), &kube::api::Patch::Merge(&patch))
                .await
                .unwrap();
            lab.wait_emulator_power(name, FakePower::Off).await;
            lab.assert_power_stays(name, "Off", Duration::from_secs(3))
                .await;
            lab.unannotate(name, &format!("reboot.metal3.io/{first}"))
                .await;
            // One owner is still holding it.
            lab.assert_power_stays(name, "Off", Duration::from_secs(5))
                .await;
            let host = lab.get(name).await;
            assert_eq!(
                annotations(&host)
                    .get(&format!("reboot.metal3.io/{second}"))
                    .map(String::as_str),
                Some(format!("client {second}").as_str()),
                "the controller never touches keyed annotations; content preserved"
            );
            lab.unannotate(name, &format!("reboot.metal3.io/{second}"))
                .await;
            lab.wait_reboot_done(name).await;
            assert_single_clean_cycle(lab, name).await;
        }
    };
    let both = async {
        lab.annotate("keyed-and-suffixless", REBOOT, "").await;
        lab.annotate(
            "keyed-and-suffixless",
            "reboot.metal3.io/fence",
            "machine-uid-1234",
        )
        .await;
        // The controller removes the suffixless one once the host is off; the keyed one holds.
        lab.wait_host(
            "keyed-and-suffixless",
            "off with only the keyed annotation left",
            POWER_TIMEOUT,
            |h| {
                let a = annotations(h);
                h.status.as_ref().and_then(|s| s.powered_on) == Some(false)
                    && !a.contains_key(REBOOT)
                    && a.contains_key("reboot.metal3.io/fence")
            },
        )
        .await;
        lab.assert_power_stays("keyed-and-suffixless", "Off", Duration::from_secs(5))
            .await;
        lab.unannotate("keyed-and-suffixless", "reboot.metal3.io/fence")
            .await;
        lab.wait_reboot_done("keyed-and-suffixless").await;
        assert_single_clean_cycle(&lab, "keyed-and-suffixless").await;
    };
    let offline = async {
        lab.annotate("goes-offline", "reboot.metal3.io/hold", "")
            .await;
        lab.wait_emulator_power("goes-offline", FakePower::Off)
            .await;
        lab.patch_spec("goes-offline", serde_json::json!({ "online": false }))
            .await;
        lab.unannotate("goes-offline", "reboot.metal3.io/hold")
            .await;
        // online: false wins once the hold is released: the host stays off.
        lab.assert_power_stays("goes-offline", "Off", Duration::from_secs(8))
            .await;
        let host = lab.get("goes-offline").await;
        assert_eq!(host.status.as_ref().and_then(|s| s.powered_on), Some(false));
        lab.patch_spec("goes-offline", serde_json::json!({ "online": true }))
            .await;
        lab.wait_reboot_done("goes-offline").await;
        assert_single_clean_cycle(&lab, "goes-offline").await;
    };
    tokio::join!(
        release_in_order("ab", "a", "b"),
        release_in_order("ba", "b", "a"),
        both,
        offline
    );
}
