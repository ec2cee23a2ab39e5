//! Where BMC credentials may go, end to end: the real operator binary, sushy-tools on
//! loopback over plain HTTP, one host whose spec and Secret stay as a metal3 user wrote them.
//! The operator's flags (`--bmc-networks`, `--allow-plain-http-bmc`,
//! `--bmc-credentials-label`) and the Secret's `hostcycle.io/bmc-addresses` annotation decide
//! whether the password is sent; each refusal is in the host's status, naming what to change
//! and nothing of the Secret.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use hostcycle_api::BareMetalHost;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

const HOST: &str = "policy-0";

fn error_message(h: &BareMetalHost) -> String {
    h.status
        .as_ref()
        .map(|s| s.error_message.clone())
        .unwrap_or_default()
}

fn powered_on_and_ok(h: &BareMetalHost) -> bool {
    let st = h.status.as_ref();
    st.and_then(|s| s.powered_on) == Some(true)
        && st.and_then(|s| s.operational_status).map(|s| s.as_str()) == Some("OK")
        && error_message(h).is_empty()
}

async fn wait_refused(lab: &Lab, what: &str, contains: &'static str) -> BareMetalHost {
    let host = lab
        .wait_host(HOST, what, POWER_TIMEOUT, |h| {
            error_message(h).contains(contains)
        })
        .await;
    let message = error_message(&host);
    assert!(!message.contains(PASSWORD), "{message}");
    host
}

async fn wait_ok(lab: &Lab, what: &str) {
    lab.wait_host(HOST, what, POWER_TIMEOUT, powered_on_and_ok)
        .await;
}

async fn patch_secret(lab: &Lab, patch: serde_json::Value) {
    let secrets: Api<Secret> = Api::namespaced(lab.client.clone(), NS);
    secrets
        .patch(SECRET, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn credentials_go_only_where_the_operator_and_the_secret_allow() {
    let mut lab = Lab::start_with(
        &[HOST],
        LabOptions {
            // The BMC (127.0.0.1) is outside the operator's BMC networks.
            bmc_policy_args: vec![
                "--bmc-networks".into(),
                "10.99.0.0/16,.bmc.example".into(),
                "--allow-plain-http-bmc".into(),
                "--bmc-credentials-label".into(),
                "none".into(),
            ],
            wait_hosts_ok: false,
            ..LabOptions::default()
        },
    )
    .await;
    let host = wait_refused(
        &lab,
        "credentials refused: the BMC is outside --bmc-networks",
        "BMC credentials are not sent to 127.0.0.1: it is outside the operator's BMC networks; \
         if this is a BMC, add its network to `hostcycle operator --bmc-networks`",
    )
    .await;
    // Every reader of hosts sees the status: it names the refused address and the flag, not
    // the operator's networks (those are in the operator's log).
    let message = error_message(&host);
    for network in ["10.99.0.0/16", ".bmc.example"] {
        assert!(!message.contains(network), "lists {network}: {message}");
    }
    assert_ne!(
        host.status.as_ref().and_then(|s| s.powered_on),
        Some(true),
        "no power state without logging in"
    );
    let error_type = host
        .status
        .as_ref()
        .and_then(|s| s.error_type)
        .map(|t| t.as_str().to_string());
    assert_eq!(
        error_type.as_deref(),
        Some("provisioned registration error")
    );

    // Inside the networks, but plain HTTP is not allowed.
    lab.set_bmc_policy(&[
        "--bmc-networks",
        "127.0.0.0/8",
        "--bmc-credentials-label",
        "none",
    ]);
    lab.start_operator();
    wait_refused(
        &lab,
        "credentials refused: plain HTTP without --allow-plain-http-bmc",
        "not sent over plain HTTP",
    )
    .await;

    // Both allowed: the host works, its spec and Secret untouched since creation.
    lab.set_bmc_policy(&[
        "--bmc-networks",
        "127.0.0.0/8",
        "--allow-plain-http-bmc",
        "--bmc-credentials-label",
        "none",
    ]);
    lab.start_operator();
    wait_ok(&lab, "powered on and OK once its BMC network is allowed").await;

    // The Secret narrows the destinations: another address listed → refused at once (the
    // Secret's metadata watch brings the host back without waiting for a poll).
    patch_secret(
        &lab,
        json!({"metadata": {"annotations": {"hostcycle.io/bmc-addresses": "127.0.0.2, 10.99.0.7"}}}),
    )
    .await;
    // The host's status says only that its Secret cannot be used (the reason is in the
    // operator's log): the same message a missing or unlabelled Secret gives.
    let refused = wait_refused(
        &lab,
        "credentials refused: the Secret lists other BMC addresses",
        "cannot be used for this host",
    )
    .await;
    let message = error_message(&refused);
    assert!(
        message.contains("cannot be used for this host")
            && !message.contains("127.0.0.1")
            && !message.contains("10.99.0.7"),
        "{message}"
    );
    let port = lab
        .redfish
        .system_address(0)
        .unwrap()
        .rsplit_once(':')
        .map(|(_, rest)| rest.split('/').next().unwrap().to_string())
        .unwrap();
    patch_secret(
        &lab,
        json!({"metadata": {"annotations": {"hostcycle.io/bmc-addresses": format!("127.0.0.2 127.0.0.1:{port}")}}}),
    )
    .await;
    wait_ok(&lab, "OK again once the Secret lists its BMC").await;

    // Only labelled Secrets: the unlabelled one is refused, labelling it is enough.
    lab.set_bmc_policy(&[
        "--bmc-networks",
        "127.0.0.0/8",
        "--allow-plain-http-bmc",
        "--bmc-credentials-label",
        "hostcycle.io/bmc-credentials=true",
    ]);
    lab.start_operator();
    let host = wait_refused(
        &lab,
        "credentials refused: the Secret lacks the required label",
        "not labelled hostcycle.io/bmc-credentials=true",
    )
    .await;
    assert!(!error_message(&host).contains("username"), "{host:?}");
    patch_secret(
        &lab,
        json!({"metadata": {"labels": {"hostcycle.io/bmc-credentials": "true"}}}),
    )
    .await;
    wait_ok(&lab, "OK once its Secret carries the label").await;
    // Settled: nothing flaps back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(powered_on_and_ok(&lab.get(HOST).await));
}
