//! BMC names under the operator's `--bmc-networks`: resolved once by hostcycle as absolute
//! names (the hosts file, then DNS with a final dot — never the pod's search list), every
//! address checked against the CIDR networks, and the driver connects to the checked
//! address: reqwest and ipmitool do no lookup of their own. The names here (`bmc.test`,
//! `.test` is reserved) exist only in a test hosts file, so a driver that looked them up
//! itself could not reach the server at all.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use hostcycle_bmc::destination::BmcNetwork;
use hostcycle_bmc::{
    BmcConnector, BmcError, ConnectorOptions, HostConnectOptions, IpmiOptions, PowerState,
    RedfishAuthMode,
};
use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const SYSTEM: &str = "/redfish/v1/Systems/1";

fn networks(list: &[&str]) -> Vec<BmcNetwork> {
    list.iter().map(|n| n.parse().unwrap()).collect()
}

/// A hosts file holding `lines`, in a directory kept alive by the returned guard.
fn hosts_file(lines: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hosts");
    std::fs::write(&file, lines).unwrap();
    (dir, file)
}

fn options_with(networks_list: &[&str], hosts: PathBuf) -> ConnectorOptions {
    ConnectorOptions {
        bmc_networks: networks(networks_list),
        hosts_file: hosts,
        ..options()
    }
}

fn basic_auth() -> HostConnectOptions {
    HostConnectOptions {
        redfish_auth: RedfishAuthMode::Basic,
        ..Default::default()
    }
}

async fn system_server() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(SYSTEM))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "@odata.id": SYSTEM,
            "Id": "1",
            "PowerState": "On",
        })))
        .mount(&server)
        .await;
    server
}

/// A TCP listener that counts the connections it accepts (and closes them).
async fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(socket);
        }
    });
    (port, accepted)
}

#[tokio::test]
async fn a_redfish_name_is_resolved_once_and_the_checked_address_is_connected_to() {
    init_tracing();
    let server = system_server().await;
    let port = server.address().port();
    let (_dir, hosts) = hosts_file("127.0.0.1 bmc.test\n");
    let connector = BmcConnector::new(options_with(&[".test", "127.0.0.1/32"], hosts));
    // Written as an absolute name: the same host as `bmc.test`.
    let driver = connector
        .connect_str(
            &format!("redfish+http://bmc.test.:{port}{SYSTEM}"),
            credentials(),
            &basic_auth(),
        )
        .unwrap();
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    // The socket went to the checked IP; the request still names the BMC (Host, and SNI
    // for HTTPS, which takes the host from the same URL).
    let requests = server.received_requests().await.unwrap();
    assert!(!requests.is_empty());
    for request in requests {
        let host = request.headers.get("host").unwrap().to_str().unwrap();
        assert_eq!(host, format!("bmc.test:{port}"));
    }
}

#[tokio::test]
async fn an_absolute_localhost_resolves_through_the_system_hosts_file() {
    init_tracing();
    let server = system_server().await;
    let port = server.address().port();
    // The real /etc/hosts; glibc alone would not find `localhost.` there.
    let options = ConnectorOptions {
        bmc_networks: networks(&["localhost", "127.0.0.1/32", "::1/128"]),
        ..options()
    };
    let driver = BmcConnector::new(options)
        .connect_str(
            &format!("redfish+http://localhost.:{port}{SYSTEM}"),
            credentials(),
            &basic_auth(),
        )
        .unwrap();
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
}

#[tokio::test]
async fn a_redfish_name_resolving_outside_the_networks_is_refused_before_any_connection() {
    init_tracing();
    let (port, accepted) = counting_listener().await;
    // The suffix admits the name; the address it resolves to is outside the CIDRs.
    let (_dir, hosts) = hosts_file("127.0.0.1 r12.test\n");
    let connector = BmcConnector::new(options_with(&[".test", "10.0.0.0/24"], hosts));
    let driver = connector
        .connect_str(
            &format!("redfish+http://r12.test:{port}{SYSTEM}"),
            credentials(),
            &basic_auth(),
        )
        .unwrap();
    let started = Instant::now();
    let error = driver.power_state().await.unwrap_err();
    assert!(
        matches!(error, BmcError::DestinationRefused(_)),
        "{error:?}"
    );
    assert_eq!(error.reason(), "DestinationRefused");
    assert!(!error.is_transient(), "not retried: {error}");
    let message = error.to_string();
    assert!(message.contains("r12.test"), "names the host: {message}");
    assert!(
        message.contains("resolves to 127.0.0.1"),
        "says where: {message}"
    );
    assert!(
        message.contains("--bmc-networks"),
        "names the flag: {message}"
    );
    assert!(!message.contains("10.0.0.0/24"), "no networks: {message}");
    assert_no_secret(&message);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "no connection reached the address"
    );
}

#[tokio::test]
async fn a_name_no_network_admits_is_never_looked_up_in_the_search_list() {
    init_tracing();
    let (port, accepted) = counting_listener().await;
    // No networks at all: nothing is resolved, nothing connected.
    let (_dir, hosts) = hosts_file("127.0.0.1 bmc.test\n");
    let connector = BmcConnector::new(options_with(&[], hosts));
    let driver = connector
        .connect_str(
            &format!("redfish+http://bmc.test:{port}{SYSTEM}"),
            credentials(),
            &basic_auth(),
        )
        .unwrap();
    let error = driver.power_state().await.unwrap_err();
    assert!(error.to_string().contains("none are configured"), "{error}");
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
}

/// A stand-in ipmitool that records its arguments in `dir/argv`.
fn recording_ipmitool(dir: &std::path::Path) -> PathBuf {
    let script = dir.join("ipmitool");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > {dir}/argv\necho 'Chassis Power is on'\n",
            dir = dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    script
}

fn ipmi_options(networks_list: &[&str], hosts: PathBuf, ipmitool: PathBuf) -> ConnectorOptions {
    ConnectorOptions {
        ipmi: IpmiOptions {
            ipmitool,
            ..IpmiOptions::default()
        },
        ..options_with(networks_list, hosts)
    }
}

#[tokio::test]
async fn ipmitool_is_given_the_checked_ip_of_a_name() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let ipmitool = recording_ipmitool(dir.path());
    let (_hosts_dir, hosts) = hosts_file("10.0.0.12 r12.oob\n");
    let connector = BmcConnector::new(ipmi_options(&[".oob", "10.0.0.0/24"], hosts, ipmitool));
    let driver = connector
        .connect_str(
            "ipmi://r12.oob.:6230",
            credentials(),
            &HostConnectOptions::default(),
        )
        .unwrap();
    assert_eq!(driver.power_state().await.unwrap(), PowerState::On);
    let argv = std::fs::read_to_string(dir.path().join("argv")).unwrap();
    let argv: Vec<&str> = argv.lines().collect();
    let h = argv.iter().position(|a| *a == "-H").unwrap();
    assert_eq!(argv[h + 1], "10.0.0.12", "{argv:?}");
    assert_eq!(argv[h + 3], "6230", "{argv:?}");
    // Messages still name the BMC as written.
    assert_eq!(driver.description().endpoint, "ipmi://r12.oob:6230");
}

#[tokio::test]
async fn ipmitool_never_runs_for_a_name_resolving_outside_the_networks() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let ipmitool = recording_ipmitool(dir.path());
    let (_hosts_dir, hosts) = hosts_file("10.0.0.12 r12.oob\n10.96.4.7 r12.oob\n");
    let connector = BmcConnector::new(ipmi_options(&[".oob", "10.0.0.0/24"], hosts, ipmitool));
    let driver = connector
        .connect_str(
            "ipmi://r12.oob",
            credentials(),
            &HostConnectOptions::default(),
        )
        .unwrap();
    let error = driver.power_state().await.unwrap_err();
    assert!(
        matches!(error, BmcError::DestinationRefused(_)),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("resolves to 10.96.4.7"),
        "{error}"
    );
    assert!(
        !dir.path().join("argv").exists(),
        "ipmitool must not have run"
    );
}
