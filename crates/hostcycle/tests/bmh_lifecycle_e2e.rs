//! The BareMetalHost controller's lifecycle rules end to end: hosts already off, leaving the
//! provisioned state, paused and detached hosts, power changed behind our back, an operator
//! killed mid-reboot, broken credentials, and the seed's Node-deletion guarantee.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use hostcycle_bmc::{BmcCredentials, HostConnectOptions};
use hostcycle_sim::{NodeSimulator, SimConfig, SimHost};
use hostcycle_testkit::bmc_emulators::FakePower;
use hostcycle_testkit::wait_until;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn powered_on(h: &hostcycle_api::BareMetalHost) -> Option<bool> {
    h.status.as_ref().and_then(|s| s.powered_on)
}

const BMC_UNHEALTHY: &str = "hostcycle_host_bmc_unhealthy_since_timestamp_seconds";
const REBOOT_PENDING: &str = "hostcycle_host_reboot_pending_since_timestamp_seconds";

/// `metric{host_namespace="default",host="…",reason="…"}` as the operator exports it.
fn host_series(metric: &str, host: &str, reason: &str) -> String {
    format!("{metric}{{host_namespace=\"{NS}\",host=\"{host}\",reason=\"{reason}\"}}")
}

/// The value of `series` on the operator's /metrics, once it is there (the host metrics
/// are refreshed every 5 s).
async fn wait_series(lab: &Lab, series: &str) -> i64 {
    wait_until(series, Duration::from_secs(30), || async {
        let text = lab.metrics().await;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{series} ")))
            .map(|v| v.trim().parse().unwrap())
    })
    .await
    .unwrap()
}

/// Waits until no series of `metric` names `host`.
async fn wait_no_series(lab: &Lab, metric: &str, host: &str) {
    let needle = format!("host=\"{host}\"");
    wait_until(
        &format!("no {metric} series for {host}"),
        Duration::from_secs(30),
        || async {
            let text = lab.metrics().await;
            (!text
                .lines()
                .any(|l| l.starts_with(metric) && l.contains(&needle)))
            .then_some(())
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn off_hosts_deprovisioning_paused_detached_and_drift() {
    let lab = Lab::start(&[
        "off-suffixless",
        "off-keyed",
        "deprovisioned",
        "paused",
        "detached",
        "drift",
    ])
    .await;

    // A suffixless request on a host that is already off: no extra power-off; the request is
    // satisfied by that off period and the host comes back once online.
    let off_suffixless = async {
        let name = "off-suffixless";
        lab.patch_spec(name, json!({ "online": false })).await;
        lab.wait_host(name, "off (online: false)", POWER_TIMEOUT, |h| {
            powered_on(h) == Some(false)
        })
        .await;
        lab.annotate(name, REBOOT, "").await;
        lab.assert_power_stays(name, "Off", Duration::from_secs(3))
            .await;
        lab.patch_spec(name, json!({ "online": true })).await;
        let host = lab.wait_reboot_done(name).await;
        assert!(!annotations(&host).contains_key(REBOOT));
        let history = lab.settled_history(name).await;
        assert_eq!(
            (history.power_offs(), history.power_ons()),
            (1, 1),
            "one off (online:false), one on: {history:?}"
        );
    };
    // A keyed request on an off host holds it off even when online turns true.
    let off_keyed = async {
        let name = "off-keyed";
        lab.patch_spec(name, json!({ "online": false })).await;
        lab.wait_host(name, "off (online: false)", POWER_TIMEOUT, |h| {
            powered_on(h) == Some(false)
        })
        .await;
        lab.annotate(name, "reboot.metal3.io/fence", "").await;
        lab.patch_spec(name, json!({ "online": true })).await;
        lab.assert_power_stays(name, "Off", Duration::from_secs(6))
            .await;
        lab.unannotate(name, "reboot.metal3.io/fence").await;
        lab.wait_reboot_done(name).await;
        let history = lab.settled_history(name).await;
        assert_eq!(
            (history.power_offs(), history.power_ons()),
            (1, 1),
            "{history:?}"
        );
    };
    // Leaving the provisioned state removes every reboot annotation, with an Event each.
    let deprovisioned = async {
        let name = "deprovisioned";
        lab.annotate(name, "reboot.metal3.io/a", "").await;
        lab.annotate(name, "reboot.metal3.io/b", HARD).await;
        lab.wait_host(name, "held off", POWER_TIMEOUT, |h| {
            powered_on(h) == Some(false)
        })
        .await;
        lab.patch_spec(name, json!({ "externallyProvisioned": false }))
            .await;
        let host = lab
            .wait_host(
                name,
                "reboot annotations cleared after leaving provisioned",
                POWER_TIMEOUT,
                |h| !has_reboot_annotation(h),
            )
            .await;
        let state = host
            .status
            .as_ref()
            .and_then(|s| s.provisioning.state.clone())
            .map(|s| s.to_string());
        assert_ne!(
            state.as_deref(),
            Some("externally provisioned"),
            "state must leave provisioned: {state:?}"
        );
        let removed: Vec<String> = lab
            .events_when(name, "RebootAnnotationRemoved for a and b", |events| {
                ["reboot.metal3.io/a", "reboot.metal3.io/b"]
                    .iter()
                    .all(|key| {
                        events
                            .iter()
                            .any(|(_, r, n)| r == "RebootAnnotationRemoved" && n.contains(key))
                    })
            })
            .await
            .into_iter()
            .filter(|(_, r, _)| r == "RebootAnnotationRemoved")
            .map(|(_, _, n)| n)
            .collect();
        for key in ["reboot.metal3.io/a", "reboot.metal3.io/b"] {
            assert!(
                removed.iter().any(|n| n.contains(key)),
                "an event names {key}: {removed:?}"
            );
        }
        // online: true and nothing holding it: it powers back on.
        lab.wait_host(name, "powered on again", POWER_TIMEOUT, |h| {
            powered_on(h) == Some(true)
        })
        .await;
    };
    // Paused: no action at all; removing the pause lets the request proceed.
    let paused = async {
        let name = "paused";
        lab.annotate(name, "baremetalhost.metal3.io/paused", "")
            .await;
        lab.annotate(name, REBOOT, HARD).await;
        lab.assert_power_stays(name, "On", Duration::from_secs(6))
            .await;
        let host = lab.get(name).await;
        assert!(
            annotations(&host).contains_key(REBOOT),
            "paused: annotation untouched"
        );
        assert_eq!(
            ts(&host).0,
            None,
            "paused: status untouched (no pendingRebootSince)"
        );
        lab.unannotate(name, "baremetalhost.metal3.io/paused").await;
        lab.wait_reboot_done(name).await;
    };
    // Detached: no power management, annotations left alone, status says detached.
    let detached = async {
        let name = "detached";
        lab.annotate(name, "baremetalhost.metal3.io/detached", "")
            .await;
        lab.annotate(name, REBOOT, HARD).await;
        lab.wait_host(name, "operationalStatus detached", POWER_TIMEOUT, |h| {
            h.status
                .as_ref()
                .and_then(|s| s.operational_status)
                .map(|s| s.as_str())
                == Some("detached")
        })
        .await;
        lab.assert_power_stays(name, "On", Duration::from_secs(5))
            .await;
        assert!(
            annotations(&lab.get(name).await).contains_key(REBOOT),
            "detached: annotation left alone"
        );
        lab.unannotate(name, "baremetalhost.metal3.io/detached")
            .await;
        lab.wait_reboot_done(name).await;
    };
    // Power changed behind our back is corrected and reported.
    let drift = async {
        let name = "drift";
        lab.redfish
            .reset(lab.index(name), "ForceOff")
            .await
            .unwrap();
        lab.wait_emulator_power(name, FakePower::Off).await;
        lab.wait_emulator_power(name, FakePower::On).await;
        let events = lab
            .events_when(name, "a PowerStateCorrected Warning", |events| {
                events
                    .iter()
                    .any(|(t, r, _)| t == "Warning" && r == "PowerStateCorrected")
            })
            .await;
        assert!(
            events
                .iter()
                .any(|(t, r, _)| t == "Warning" && r == "PowerStateCorrected"),
            "PowerStateCorrected expected: {events:?}"
        );
        // online: false powers off (soft), and stays off.
        lab.patch_spec(name, json!({ "online": false })).await;
        lab.wait_emulator_power(name, FakePower::Off).await;
        lab.assert_power_stays(name, "Off", Duration::from_secs(3))
            .await;
    };
    tokio::join!(
        off_suffixless,
        off_keyed,
        deprovisioned,
        paused,
        detached,
        drift
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_killed_mid_reboot_finishes_it_without_a_second_power_cycle() {
    let mut lab = Lab::start(&["crash"]).await;
    let name = "crash";
    // A power cycle (suffixless) plus a client holding the host off (keyed).
    lab.annotate(name, REBOOT, "").await;
    lab.annotate(name, "reboot.metal3.io/hold", "").await;

    // Crash 1: the power-off was sent (its Event is published after the call).
    lab.wait_event(name, "PowerOff").await;
    lab.kill_operator();
    lab.start_operator();

    // Crash 2: while the keyed annotation holds the host off. The restarted operator must
    // neither power it on nor send another power-off.
    lab.wait_host(
        name,
        "off and held by the keyed annotation only",
        POWER_TIMEOUT,
        |h| powered_on(h) == Some(false) && !annotations(h).contains_key(REBOOT),
    )
    .await;
    lab.kill_operator();
    lab.start_operator();
    lab.assert_power_stays(name, "Off", Duration::from_secs(4))
        .await;
    lab.unannotate(name, "reboot.metal3.io/hold").await;

    // Crash 3: the power-on was sent, not yet seen done.
    lab.wait_event(name, "PowerOn").await;
    lab.kill_operator();
    lab.start_operator();
    lab.wait_reboot_done(name).await;

    let history = lab.settled_history(name).await;
    assert_eq!(
        (history.power_offs(), history.power_ons()),
        (1, 1),
        "exactly one power cycle: {history:?}"
    );
    // The write-ahead record: the power-on that ended the reboot was requested once.
    let last = lab
        .get(name)
        .await
        .status
        .unwrap()
        .last_power_action
        .unwrap();
    assert_eq!(last.action, hostcycle_api::PowerTarget::On, "{last:?}");
    assert_eq!(
        last.attempts, 1,
        "the power-on was requested once: {last:?}"
    );
    assert_eq!(
        last.state,
        hostcycle_api::PowerActionState::Completed,
        "{last:?}"
    );
    let reasons = lab.event_reasons(name).await;
    assert_eq!(
        reasons.iter().filter(|r| *r == "PowerOff").count(),
        1,
        "one power-off request: {reasons:?}"
    );
    assert_eq!(
        reasons.iter().filter(|r| *r == "PowerOn").count(),
        1,
        "one power-on request: {reasons:?}"
    );
    // And nothing more happens afterwards.
    lab.assert_power_stays(name, "On", Duration::from_secs(5))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wrong_credentials_surface_in_status_and_recover_when_the_secret_is_fixed() {
    let lab = Lab::start(&["creds", "no-secret"]).await;
    let secrets: Api<Secret> = Api::namespaced(lab.client.clone(), NS);
    let bad: Secret = serde_json::from_value(json!({
        "metadata": { "name": "bad-credentials" },
        "stringData": { "username": USER, "password": "wrong" },
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &bad).await.unwrap();
    lab.patch_spec(
        "creds",
        json!({ "bmc": { "credentialsName": "bad-credentials" } }),
    )
    .await;
    lab.patch_spec(
        "no-secret",
        json!({ "bmc": { "credentialsName": "missing-secret" } }),
    )
    .await;

    let is_error = |h: &hostcycle_api::BareMetalHost| {
        h.status
            .as_ref()
            .and_then(|s| s.operational_status)
            .map(|s| s.as_str())
            == Some("error")
    };
    let host = lab
        .wait_host(
            "creds",
            "operationalStatus error after wrong password",
            POWER_TIMEOUT,
            is_error,
        )
        .await;
    let st = host.status.clone().unwrap();
    let error_type = st
        .error_type
        .map(|e| e.as_str().to_string())
        .unwrap_or_default();
    assert!(
        error_type.contains("registration error"),
        "credential failures are registration errors: {error_type}"
    );
    assert!(
        st.error_message.contains("401") || st.error_message.to_lowercase().contains("auth"),
        "message: {}",
        st.error_message
    );
    // The alert's series: since the BMCHealthy condition turned False.
    let since = wait_series(
        &lab,
        &host_series(BMC_UNHEALTHY, "creds", "CredentialsRejected"),
    )
    .await;
    let condition = st
        .conditions
        .iter()
        .find(|c| c.type_ == "BMCHealthy")
        .unwrap();
    assert_eq!(since, condition.last_transition_time.0.as_second());
    assert!(
        !st.error_message.contains("wrong"),
        "the password never appears in status: {}",
        st.error_message
    );
    let host = lab
        .wait_host(
            "no-secret",
            "operationalStatus error for a missing Secret",
            POWER_TIMEOUT,
            is_error,
        )
        .await;
    let message = host.status.unwrap().error_message;
    assert!(
        message.contains("missing-secret"),
        "message names the Secret: {message}"
    );

    // A request made while the BMC is unusable is held, not lost, and not hot-looped.
    lab.annotate("creds", REBOOT, "").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let count_before = lab.get("creds").await.status.unwrap().error_count;
    assert!(
        count_before <= 3,
        "errors back off instead of hot-looping: errorCount {count_before} after ~3 s"
    );

    // Fix the Secret: the host recovers promptly (the controller watches Secrets).
    let fixed = json!({ "stringData": { "password": PASSWORD } });
    secrets
        .patch(
            "bad-credentials",
            &PatchParams::default(),
            &Patch::Merge(&fixed),
        )
        .await
        .unwrap();
    let host = lab
        .wait_host(
            "creds",
            "recovered to OK with goodCredentials",
            Duration::from_secs(20),
            |h| {
                let st = h.status.as_ref();
                st.and_then(|s| s.operational_status).map(|s| s.as_str()) == Some("OK")
                    && st.and_then(|s| s.good_credentials.as_ref()).is_some()
            },
        )
        .await;
    assert!(host.status.unwrap().error_message.is_empty());
    wait_no_series(&lab, BMC_UNHEALTHY, "creds").await;
    lab.wait_reboot_done("creds").await;
    let events = lab
        .events_when("creds", "a BMCError Warning", |events| {
            events
                .iter()
                .any(|(t, r, _)| t == "Warning" && r == "BMCError")
        })
        .await;
    assert!(
        events
            .iter()
            .any(|(t, r, _)| t == "Warning" && r == "BMCError"),
        "BMCError event: {events:?}"
    );
    for (_, _, note) in &events {
        assert!(
            !note.contains(PASSWORD) && !note.contains("wrong"),
            "no secret in events: {note}"
        );
    }
}

/// The seed's guarantees with real (simulated) nodes: with a keyed annotation a client can
/// delete the Node before the host boots again, and once lastPoweredOn passes the request the
/// kubelet that ran at the request is gone (a new boot registered the node).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keyed_fencing_lets_a_client_delete_the_node_before_the_host_boots() {
    let lab = Lab::start(&["fenced"]).await;
    let name = "fenced";
    let bmc = hostcycle_sim::bmc_connector()
        .connect_str(
            &lab.redfish.system_address(0).unwrap(),
            BmcCredentials::new(USER, PASSWORD).unwrap(),
            &HostConnectOptions::default(),
        )
        .unwrap();
    let sim = NodeSimulator::new(
        lab.client.clone(),
        SimConfig {
            boot_delay: Duration::from_secs(1),
            ..SimConfig::default()
        },
        vec![SimHost {
            node_name: name.into(),
            control_plane: false,
            internal_ip: "192.0.2.50".into(),
            bmc,
        }],
    )
    .spawn();
    let nodes: Api<Node> = Api::all(lab.client.clone());
    let boot_id = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.clone())
    };
    let first = wait_until(
        "Node fenced registered",
        Duration::from_secs(30),
        || async { nodes.get_opt(name).await.ok()? },
    )
    .await
    .unwrap();
    let first_boot = boot_id(&first);

    // Remediation-style client: fence, delete the Node while the host is off, release.
    lab.annotate(name, "reboot.metal3.io/remediation", "machine-uid")
        .await;
    lab.wait_host(name, "fenced off", POWER_TIMEOUT, |h| {
        powered_on(h) == Some(false)
    })
    .await;
    lab.assert_power_stays(name, "Off", Duration::from_secs(2))
        .await;
    // Held off on purpose: the pending reboot's series says so (the alert on reboots stuck
    // leaves this reason out).
    let since = wait_series(
        &lab,
        &host_series(REBOOT_PENDING, name, "HeldByAnnotations"),
    )
    .await;
    let pending = ts(&lab.get(name).await).0.unwrap();
    assert_eq!(since, pending.as_second());
    nodes.delete(name, &DeleteParams::default()).await.unwrap();
    wait_until("Node fenced deleted", Duration::from_secs(20), || async {
        nodes.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();
    let deleted_at = jiff::Timestamp::now();
    // Still off: the host cannot boot (and re-register) while the annotation is there.
    lab.assert_power_stays(name, "Off", Duration::from_secs(3))
        .await;
    lab.unannotate(name, "reboot.metal3.io/remediation").await;
    let host = lab.wait_reboot_done(name).await;
    let (pending, powered_on_at) = ts(&host);
    assert!(powered_on_at.unwrap() > pending.unwrap());
    wait_no_series(&lab, REBOOT_PENDING, name).await;
    let node = wait_until(
        "Node fenced re-registered after boot",
        Duration::from_secs(30),
        || async { nodes.get_opt(name).await.ok()? },
    )
    .await
    .unwrap();
    let created = node.metadata.creation_timestamp.clone().unwrap().0;
    assert!(
        created > deleted_at,
        "the Node was re-registered after the deletion ({created} > {deleted_at})"
    );
    assert_ne!(
        boot_id(&node),
        first_boot,
        "a new boot: every process of the old one has stopped"
    );
    sim.stop().await;
}

/// One BMC that accepts connections but never answers must not slow the others: a healthy
/// host's reboot completes at normal speed meanwhile, and the hung one ends in an error status
/// that names the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_bmc_does_not_slow_other_hosts() {
    let lab = Lab::start(&["healthy"]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket); // accept, never answer
        }
    });
    let hung = hostcycle_api::BareMetalHost::externally_provisioned(
        "hung",
        &format!("redfish+http://127.0.0.1:{port}/redfish/v1/Systems/1"),
        SECRET,
    );
    lab.hosts
        .create(&PostParams::default(), &hung)
        .await
        .unwrap();

    let started = std::time::Instant::now();
    lab.annotate("healthy", REBOOT, HARD).await;
    lab.wait_reboot_done("healthy").await;
    let took = started.elapsed();
    // A hard reboot through the fake driver takes 2–22 s plus polling; a blocked controller
    // would add the hung BMC's 8 s deadline per attempt.
    assert!(
        took < Duration::from_secs(35),
        "healthy host's reboot took {took:?}"
    );

    let host = lab
        .wait_host(
            "hung",
            "error status after its BMC timed out",
            Duration::from_secs(30),
            |h| {
                h.status
                    .as_ref()
                    .and_then(|s| s.operational_status)
                    .map(|s| s.as_str())
                    == Some("error")
            },
        )
        .await;
    let message = host.status.unwrap().error_message;
    assert!(
        message.to_lowercase().contains("timed out") || message.contains("Timeout"),
        "names the timeout: {message}"
    );
    wait_series(&lab, &host_series(BMC_UNHEALTHY, "hung", "BMCUnreachable")).await;
    // What the operator serves is what the alert and dashboard tests check against
    // (tests/monitoring.rs): every metric family it has samples for is in that list.
    let exported = hostcycle_operator::metrics::exported_sample_names().unwrap();
    let served = lab.metrics().await;
    for line in served
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name = line.split(['{', ' ']).next().unwrap();
        assert!(
            exported.iter().any(|e| e == name),
            "/metrics serves {name}, missing from exported_sample_names()"
        );
    }
    hold.abort();
}
