//! The reboot queue when things go wrong or look different: rebooting by command (CKE's
//! way), the operator SIGKILLed mid-drain, mid-reboot and mid-command, and hosts managed by
//! metal3's baremetal-operator (no `lastPoweredOn`) with `--controllers reboot-queue`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::queue::*;
use common::{LabOptions, PASSWORD, USER};
use hostcycle_api::queue::{EntryPhase, RebootMethod};
use hostcycle_api::{BareMetalHost, REBOOT_ANNOTATION};
use hostcycle_testkit::bmc_emulators::RedfishEmulator;
use hostcycle_testkit::wait_until;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Writes an executable shell script.
fn script(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\nset -eu\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// `case` arms mapping each simulated node's InternalIP to a value.
fn by_address(hosts: &[HostSpec], value: impl Fn(usize, &HostSpec) -> String) -> String {
    hosts
        .iter()
        .enumerate()
        .map(|(i, h)| format!("  192.0.2.{}) {} ;;\n", 10 + i, value(i, h)))
        .collect()
}

/// How one node's reboot command behaves: seconds to hang before the power cycle, and after
/// it (a command that rebooted the node and then hangs).
#[derive(Clone, Copy)]
struct Hang {
    before: u32,
    after: u32,
}

const PROMPT: Hang = Hang {
    before: 0,
    after: 0,
};

/// A reboot command (a power cycle through the BMC with `hostcycle bmc cycle --hard`, after
/// and before optional hangs) and a boot check (the Node is Ready, and Ready since a boot
/// after the given Unix time: the simulated kubelet stamps its conditions with its boot
/// time), both keyed by the node's address as CKE passes it.
fn command_scripts(
    dir: &Path,
    hosts: &[HostSpec],
    redfish: &RedfishEmulator,
    kubeconfig: &Path,
    hang: impl Fn(&HostSpec) -> Hang,
) -> (String, String) {
    let password = dir.join("bmc-password");
    std::fs::write(&password, PASSWORD).unwrap();
    let hostcycle = env!("CARGO_BIN_EXE_hostcycle");
    let reboot = script(
        dir,
        "reboot.sh",
        &format!(
            "echo \"$(date +%s.%N) $1\" >> {log}\ncase \"$1\" in\n{arms}  *) echo \"unknown node $1\" >&2; exit 2 ;;\nesac\nsleep \"$delay\"\n{hostcycle} bmc cycle --hard --address \"$addr\" --username {USER} --password-file {pw} --wait-timeout 60s --poll-interval 250ms || exit $?\nsleep \"$after\"\n",
            log = dir.join("reboots.log").display(),
            arms = by_address(hosts, |i, h| format!(
                "addr='{}'; delay={}; after={}",
                redfish.system_address(i).unwrap(),
                hang(h).before,
                hang(h).after,
            )),
            pw = password.display(),
        ),
    );
    let boot_check = script(
        dir,
        "boot-check.sh",
        &format!(
            "case \"$1\" in\n{arms}  *) exit 2 ;;\nesac\nstate=$(/usr/bin/kubectl --kubeconfig {kc} get node \"$node\" -o jsonpath='{{.status.conditions[?(@.type==\"Ready\")].status}} {{.status.conditions[?(@.type==\"Ready\")].lastTransitionTime}}')\nready=${{state%% *}}\nsince=$(date -d \"${{state#* }}\" +%s)\nif [ \"$ready\" = True ] && [ \"$since\" -gt \"$2\" ]; then echo true; else echo false; fi\n",
            arms = by_address(hosts, |_, h| format!("node='{}'", h.name)),
            kc = kubeconfig.display(),
        ),
    );
    (reboot, boot_check)
}

fn reboot_runs(dir: &Path, address: &str) -> usize {
    std::fs::read_to_string(dir.join("reboots.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.ends_with(&format!(" {address}")))
        .count()
}

/// CKE's way: `rebootCommand <address>` and `bootCheckCommand <address> <unix-time>`, from the
/// operator's command set `default` (ConfigMap `hostcycle-reboot-commands`). Two
/// workers reboot one after the other; the operator is SIGKILLed while the second one's
/// reboot command runs, and the restarted operator does not run it again: the boot check
/// confirms the boot and the entry completes. Exactly one power cycle per node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn command_method_rolling_reboot_survives_a_kill_mid_command() {
    let hosts = [worker("c-0"), worker("c-1")];
    let mut lab = QueueLab::start(&hosts, fast_queue()).await;
    let dir = tempfile::tempdir().unwrap();
    let (reboot, boot_check) = command_scripts(
        dir.path(),
        &hosts,
        &lab.lab.redfish,
        lab.lab.cluster.kubeconfig_path(),
        |_| Hang {
            before: 3,
            after: 0,
        },
    );
    lab.set_reboot_commands("default", &[&reboot], &[&boot_check])
        .await;
    lab.patch_queue(json!({ "reboot": {
        "method": "Command",
        "commandTimeoutSeconds": 90,
        "bootCheckIntervalSeconds": 1,
    }}))
    .await;
    lab.queue("c-0").await;
    lab.queue("c-1").await;

    let rebooting = lab
        .wait_phase("c-0", EntryPhase::Rebooting, REBOOT_TIMEOUT)
        .await;
    let progress = rebooting.status.unwrap().reboot.unwrap();
    assert_eq!(progress.method, RebootMethod::Command);
    assert_eq!(
        progress.command_attempts, 1,
        "the attempt is recorded first"
    );
    lab.wait_entry_gone("c-0", REBOOT_TIMEOUT).await;

    // c-1: kill the operator while its reboot command sleeps before cycling the host.
    lab.wait_phase("c-1", EntryPhase::Rebooting, REBOOT_TIMEOUT)
        .await;
    let what = "the reboot command for c-1 (192.0.2.11) to start";
    hostcycle_testkit::wait_until(what, Duration::from_secs(30), || async {
        (reboot_runs(dir.path(), "192.0.2.11") == 1).then_some(())
    })
    .await
    .unwrap();
    lab.lab.kill_operator();
    lab.lab.start_operator();
    lab.wait_entry_gone("c-1", REBOOT_TIMEOUT).await;

    for (node, address) in [("c-0", "192.0.2.10"), ("c-1", "192.0.2.11")] {
        assert_eq!(
            reboot_runs(dir.path(), address),
            1,
            "{node}: the reboot command ran once"
        );
        assert_eq!(
            lab.boots(node).await,
            2,
            "{node}: rebooted once (one boot after the first)"
        );
        assert!(!cordoned(&lab.node(node).await), "{node} uncordoned");
        let reasons = lab.wait_event_reasons_about(node, &["BootConfirmed"]).await;
        assert!(
            reasons.iter().any(|r| r == "BootConfirmed"),
            "{node}: {reasons:?}"
        );
    }

    // Entries the queue removes by itself, with a Warning: a node that does not exist, and a
    // second entry for a node already queued (the first wins).
    let ghost = lab.queue("ghost").await;
    lab.wait_entry_gone("ghost", REBOOT_TIMEOUT).await;
    wait_until(
        &format!("a NodeNotFound Event about entry {ghost}"),
        Duration::from_secs(30),
        || async {
            lab.event_reasons_about(&ghost)
                .await
                .iter()
                .any(|r| r == "NodeNotFound")
                .then_some(())
        },
    )
    .await
    .unwrap();
    let notes = lab.events_about(&ghost).await;
    assert!(
        notes.iter().any(|(r, _)| r == "NodeNotFound"),
        "NodeNotFound Event: {notes:?}"
    );

    // A boot that is never confirmed: Warning, condition and metric; the entry keeps waiting
    // and the node stays cordoned until the entry is cancelled.
    lab.set_reboot_commands(
        "never-boots",
        &["/usr/bin/true"],
        &["/usr/bin/echo", "false"],
    )
    .await;
    lab.patch_queue(json!({ "reboot": {
        "commands": "never-boots",
        "bootTimeoutSeconds": 5,
    }}))
    .await;
    lab.queue("c-0").await;
    let duplicate = lab.queue("c-0").await;
    let what = "the duplicate entry for c-0 to be removed";
    hostcycle_testkit::wait_until(what, REBOOT_TIMEOUT, || async {
        lab.entries
            .get_opt(&duplicate)
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await
    .unwrap();
    lab.wait_event_reasons_about(&duplicate, &["DuplicateEntry"])
        .await;
    let overdue = lab
        .wait_entry("c-0", "BootTimedOut condition", REBOOT_TIMEOUT, |e| {
            e.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "BootTimedOut" && c.status == "True")
            })
        })
        .await;
    assert_eq!(overdue.phase(), EntryPhase::Rebooting, "it keeps waiting");
    assert!(
        cordoned_by_queue(&lab.node("c-0").await),
        "never uncordoned while not booted"
    );
    // The BootTimedOut Warning on the Node.
    lab.wait_event_reasons_about("c-0", &["BootTimedOut"]).await;
    let metrics = lab.lab.metrics().await;
    assert!(
        metrics.contains("hostcycle_reboot_queue_boot_timeouts_total 1")
            && metrics.contains("hostcycle_reboot_queue_boot_overdue_entries 1"),
        "boot timeout metrics in\n{metrics}"
    );
    lab.cancel("c-0").await;
    lab.wait_entry_gone("c-0", REBOOT_TIMEOUT).await;
    lab.wait_node("c-0", "uncordoned after the cancel", REBOOT_TIMEOUT, |n| {
        !cordoned(n)
    })
    .await;
}

/// A node whose kubelet writes an InternalIP starting with `-` — what a compromised node
/// could do to turn `rebootCommand <address>` into `ssh -oProxyCommand=…` — is never passed
/// to a command: its entry waits `Blocked` (reason `UnsafeNodeAddress`) with an
/// `UnsafeNodeAddress` Warning naming the node, and the node is not drained; the other node
/// (a plain IP) goes through the queue meanwhile, its address passed as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_address_starting_with_a_hyphen_never_reaches_the_commands() {
    const HOSTILE: &str = "-oProxyCommand=touch /tmp/hostcycle-pwned";
    let hosts = [worker_at("u-0", HOSTILE), worker("u-1")];
    let lab = QueueLab::start(&hosts, fast_queue()).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("argv.log");
    // Both commands record their argv, then do their work: a real power cycle through the
    // BMC and a real boot check (an entry completes only once its Node booted anew).
    let (reboot, boot_check) = command_scripts(
        dir.path(),
        &hosts,
        &lab.lab.redfish,
        lab.lab.cluster.kubeconfig_path(),
        |_| PROMPT,
    );
    let recorded = |name: &str, command: &str| {
        script(
            dir.path(),
            name,
            &format!("echo \"$@\" >> {}\nexec {command} \"$@\"\n", log.display()),
        )
    };
    lab.set_reboot_commands(
        "default",
        &[&recorded("record-reboot.sh", &reboot)],
        &[&recorded("record-boot-check.sh", &boot_check)],
    )
    .await;
    lab.patch_queue(json!({ "reboot": {
        "method": "Command",
        "bootCheckIntervalSeconds": 1,
    }}))
    .await;
    assert_eq!(
        lab.node("u-0").await.status.unwrap().addresses.unwrap()[0].address,
        HOSTILE,
        "the API server keeps what the kubelet wrote"
    );
    let hostile_entry = lab.queue("u-0").await;
    lab.queue("u-1").await;

    let blocked = lab
        .wait_entry("u-0", "Blocked (UnsafeNodeAddress)", REBOOT_TIMEOUT, |e| {
            e.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Blocked" && c.status == "True" && c.reason == "UnsafeNodeAddress"
                })
            })
        })
        .await;
    let message = blocked.status.as_ref().unwrap().message.clone();
    assert!(
        message.contains("cannot be rebooted by command") && message.contains("starts with '-'"),
        "{message}"
    );
    lab.wait_event_reasons_about(&hostile_entry, &["UnsafeNodeAddress"])
        .await;
    let notes = lab.events_about(&hostile_entry).await;
    assert!(
        notes
            .iter()
            .any(|(r, note)| r == "UnsafeNodeAddress" && note.contains("node u-0")),
        "{notes:?}"
    );
    // The other node is not held back: rebooted by command with its IP.
    lab.wait_entry_gone("u-1", REBOOT_TIMEOUT).await;
    let argv = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(argv.lines().any(|l| l.starts_with("192.0.2.11")), "{argv}");
    // Still waiting, never drained, and no command ever got the hostile value.
    let entry = lab.entry("u-0").await.unwrap();
    assert_eq!(entry.phase(), EntryPhase::Queued);
    assert!(!cordoned(&lab.node("u-0").await), "u-0 was never cordoned");
    assert!(
        !argv.contains("-oProxyCommand") && !argv.contains("u-0"),
        "a command got the hostile address: {argv}"
    );
    assert!(!Path::new("/tmp/hostcycle-pwned").exists());
}

/// A node whose kubelet writes another node's IP as its InternalIP (a-0 claims a-2's
/// 192.0.2.12) would have `rebootCommand <address>` reboot a-2, undrained, and a-2's boot
/// check complete a-0's entry. Its entry waits `Blocked` (reason `AmbiguousNodeAddress`) with
/// a Warning naming both nodes and the address; it is not drained, and no command ever gets
/// the address. A node with an address of its own (a-1) goes through the queue meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_claiming_another_nodes_address_is_never_rebooted_by_command() {
    const CLAIMED: &str = "192.0.2.12";
    let hosts = [worker_at("a-0", CLAIMED), worker("a-1"), worker("a-2")];
    let lab = QueueLab::start(&hosts, fast_queue()).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("argv.log");
    let (reboot, boot_check) = command_scripts(
        dir.path(),
        &hosts,
        &lab.lab.redfish,
        lab.lab.cluster.kubeconfig_path(),
        |_| PROMPT,
    );
    let recorded = |name: &str, command: &str| {
        script(
            dir.path(),
            name,
            &format!("echo \"$@\" >> {}\nexec {command} \"$@\"\n", log.display()),
        )
    };
    lab.set_reboot_commands(
        "default",
        &[&recorded("record-reboot.sh", &reboot)],
        &[&recorded("record-boot-check.sh", &boot_check)],
    )
    .await;
    lab.patch_queue(json!({ "reboot": {
        "method": "Command",
        "bootCheckIntervalSeconds": 1,
    }}))
    .await;
    for node in ["a-0", "a-2"] {
        assert_eq!(
            lab.node(node).await.status.unwrap().addresses.unwrap()[0].address,
            CLAIMED,
            "{node} reports {CLAIMED}"
        );
    }
    let a2_boot = lab
        .node("a-2")
        .await
        .status
        .unwrap()
        .node_info
        .unwrap()
        .boot_id;
    let claiming_entry = lab.queue("a-0").await;
    lab.queue("a-1").await;

    let blocked = lab
        .wait_entry(
            "a-0",
            "Blocked (AmbiguousNodeAddress)",
            REBOOT_TIMEOUT,
            |e| {
                e.status.as_ref().is_some_and(|s| {
                    s.conditions.iter().any(|c| {
                        c.type_ == "Blocked"
                            && c.status == "True"
                            && c.reason == "AmbiguousNodeAddress"
                    })
                })
            },
        )
        .await;
    let message = blocked.status.as_ref().unwrap().message.clone();
    assert!(
        message.contains("is also an address of node a-2") && message.contains(CLAIMED),
        "{message}"
    );
    lab.wait_event_reasons_about(&claiming_entry, &["AmbiguousNodeAddress"])
        .await;
    let notes = lab.events_about(&claiming_entry).await;
    assert!(
        notes.iter().any(|(r, note)| r == "AmbiguousNodeAddress"
            && note.contains("node a-0")
            && note.contains("node a-2")
            && note.contains(CLAIMED)),
        "{notes:?}"
    );
    // The other node is not held back: rebooted by command with its own IP.
    lab.wait_entry_gone("a-1", REBOOT_TIMEOUT).await;
    let argv = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(argv.lines().any(|l| l.starts_with("192.0.2.11")), "{argv}");
    // Still waiting, never drained; no command got the claimed address; a-2 never rebooted.
    let entry = lab.entry("a-0").await.unwrap();
    assert_eq!(entry.phase(), EntryPhase::Queued);
    assert!(!cordoned(&lab.node("a-0").await), "a-0 was never cordoned");
    assert!(!cordoned(&lab.node("a-2").await), "a-2 was never cordoned");
    assert!(
        !argv.contains(CLAIMED),
        "a command got the claimed address: {argv}"
    );
    let a2_now = lab
        .node("a-2")
        .await
        .status
        .unwrap()
        .node_info
        .unwrap()
        .boot_id;
    assert_eq!(a2_now, a2_boot, "a-2 was not rebooted");
}

/// Reboot commands that hang, and one that does not, side by side (`maxConcurrentReboots` 3):
/// - h-0's command hangs before it reaches the BMC: killed after `commandTimeoutSeconds` and
///   **not run again**, though `commandRetries` is 1 and the boot check says the node has not
///   booted — a run that timed out may have reached the node with a reboot still pending,
///   which "not booted yet" cannot tell from no reboot; reported (`RebootCommandFailed`). The
///   entry keeps waiting for a boot; cancelled, it keeps its node cordoned (the command ran and
///   may have rebooted it) until the entry is deleted.
/// - h-2's command power-cycles the node, then hangs: killed after the timeout, the boot check
///   says the node booted, so it is **not** run again — exactly one reboot.
/// - h-1 reboots untouched, exactly once, while the others hang: a hanging command stalls
///   neither other entries nor the controller. While a command power-cycles a host, the host
///   controller leaves it to the command (the host carries the queue's command marker) and
///   never "corrects" it (no `PowerStateCorrected`).
///
/// The timeout (30 s) is longer than one power cycle through the emulator (2 × 1–11 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hanging_reboot_command_stalls_nothing_else() {
    let hosts = [worker("h-0"), worker("h-1"), worker("h-2")];
    let lab = QueueLab::start(&hosts, fast_queue()).await;
    let dir = tempfile::tempdir().unwrap();
    let (reboot, boot_check) = command_scripts(
        dir.path(),
        &hosts,
        &lab.lab.redfish,
        lab.lab.cluster.kubeconfig_path(),
        |h| match h.name {
            "h-0" => Hang {
                before: 600,
                after: 0,
            },
            "h-2" => Hang {
                before: 0,
                after: 600,
            },
            _ => PROMPT,
        },
    );
    lab.set_reboot_commands("default", &[&reboot], &[&boot_check])
        .await;
    lab.patch_queue(json!({
        "maxConcurrentReboots": 3,
        "reboot": {
            "method": "Command",
            "commandTimeoutSeconds": 30,
            "commandRetries": 1,
            "commandIntervalSeconds": 1,
            "bootCheckIntervalSeconds": 1,
        },
    }))
    .await;
    let h1_host = lab.lab.hosts.clone();
    let marked = tokio::spawn(async move {
        // The command marker appears on h-1's host while its command runs.
        hostcycle_testkit::wait_until(
            "h-1's host to carry the queue's command marker",
            REBOOT_TIMEOUT,
            || async {
                h1_host.get("h-1").await.ok().and_then(|h| {
                    h.annotations()
                        .contains_key("hostcycle.io/reboot-queue-command")
                        .then_some(())
                })
            },
        )
        .await
    });
    lab.queue("h-0").await;
    lab.queue("h-1").await;
    lab.queue("h-2").await;
    lab.wait_entry_gone("h-1", REBOOT_TIMEOUT).await;
    marked.await.unwrap().unwrap();
    assert_eq!(lab.boots("h-1").await, 2, "h-1 rebooted exactly once");
    assert_eq!(lab.power_cycles("h-1").await, 1, "h-1: one power cycle");
    lab.wait_entry_gone("h-2", REBOOT_TIMEOUT).await;
    assert_eq!(
        reboot_runs(dir.path(), "192.0.2.12"),
        1,
        "h-2's command rebooted the node before it hung: the boot check said so, no retry"
    );
    assert_eq!(lab.boots("h-2").await, 2, "h-2 rebooted exactly once");
    assert_eq!(lab.power_cycles("h-2").await, 1, "h-2: one power cycle");
    for host in ["h-1", "h-2"] {
        let reasons = lab.lab.event_reasons(host).await;
        assert!(
            !reasons.iter().any(|r| r == "PowerStateCorrected"),
            "{host}: the host controller corrected a host its command was power-cycling: \
             {reasons:?}"
        );
        lab.lab
            .wait_host(host, "the command marker removed", REBOOT_TIMEOUT, |h| {
                !h.annotations()
                    .contains_key("hostcycle.io/reboot-queue-command")
            })
            .await;
    }
    let stuck = lab
        .wait_entry("h-0", "reboot command given up", REBOOT_TIMEOUT, |e| {
            e.status
                .as_ref()
                .and_then(|s| s.reboot.as_ref())
                .is_some_and(|r| r.command_failure.is_some())
        })
        .await;
    let progress = stuck.status.as_ref().unwrap().reboot.clone().unwrap();
    assert_eq!(
        progress.command_attempts, 1,
        "one try, recorded; a run that timed out is never retried"
    );
    assert_eq!(
        reboot_runs(dir.path(), "192.0.2.10"),
        1,
        "h-0's command ran once"
    );
    let failure = progress.command_failure.unwrap();
    assert!(
        failure.contains("timed out") && failure.contains("pending"),
        "the failure says the command timed out and why it is not run again: {failure}"
    );
    assert_eq!(stuck.phase(), EntryPhase::Rebooting);
    lab.wait_event_reasons_about(&stuck.name_any(), &["RebootCommandFailed"])
        .await;
    assert_eq!(
        (lab.power_cycles("h-0").await, lab.boots("h-0").await),
        (0, 1),
        "the hung command never got to the BMC"
    );
    lab.cancel("h-0").await;
    let waiting = lab
        .wait_entry("h-0", "cancel acknowledged", REBOOT_TIMEOUT, |e| {
            e.status
                .as_ref()
                .is_some_and(|s| s.message.contains("cancel requested"))
        })
        .await;
    assert!(
        waiting
            .status
            .as_ref()
            .unwrap()
            .message
            .contains("delete the entry"),
        "the message says how to give up: {:?}",
        waiting.status
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        lab.entry("h-0").await.is_some() && cordoned(&lab.node("h-0").await),
        "the command ran: h-0 stays cordoned while its cancelled entry waits"
    );
    lab.entries
        .delete(&waiting.name_any(), &Default::default())
        .await
        .unwrap();
    lab.wait_entry_gone("h-0", REBOOT_TIMEOUT).await;
    lab.wait_node(
        "h-0",
        "uncordoned once its entry is deleted",
        REBOOT_TIMEOUT,
        |n| !cordoned(n),
    )
    .await;
    assert_eq!(
        (lab.power_cycles("h-0").await, lab.boots("h-0").await),
        (0, 1),
        "h-0 was never rebooted"
    );
}

/// SIGKILL at three points — mid-drain, right after the reboot was requested, and while the
/// host is powered off — and the restarted operator finishes each without a second power
/// cycle and without leaving the node cordoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_killed_mid_drain_and_mid_reboot_resumes_without_a_second_reboot() {
    let hosts = [worker("k-0"), worker("k-1"), worker("k-2")];
    let mut lab = QueueLab::start(&hosts, fast_queue()).await;
    lab.namespace("work", &[]).await;
    lab.deployment("work", "held", 1, Some("k-0")).await;
    lab.wait_running("work", "held", 1).await;
    let held = lab.hold_pod("work", "held").await;

    // Mid-drain: k-0's only pod stays Terminating until released.
    lab.queue("k-0").await;
    lab.wait_entry(
        "k-0",
        "draining, waiting for the held pod",
        REBOOT_TIMEOUT,
        |e| {
            e.phase() == EntryPhase::Draining
                && e.status
                    .as_ref()
                    .is_some_and(|s| s.message.contains("waiting for"))
        },
    )
    .await;
    lab.lab.kill_operator();
    assert!(cordoned_by_queue(&lab.node("k-0").await));
    lab.lab.start_operator();
    lab.release_pod(&held).await;
    lab.wait_entry_gone("k-0", REBOOT_TIMEOUT).await;
    assert_eq!(lab.power_cycles("k-0").await, 1, "k-0: one power cycle");
    assert!(!cordoned(&lab.node("k-0").await), "k-0 uncordoned");

    // Right after the reboot was requested. The host controller must not be able to act yet:
    // a kill between its own write-ahead record and its BMC call makes it wait out its
    // in-flight timeout (its documented behaviour, tested elsewhere), which is not what this
    // scenario is about. So k-1's BMC rejects the host controller's credentials until the
    // operator has been killed and restarted.
    let hosts_api: Api<BareMetalHost> = Api::namespaced(lab.client.clone(), common::NS);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(lab.client.clone(), common::NS);
    let wrong: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": { "name": "wrong-credentials" },
        "stringData": { "username": USER, "password": "not-the-password" },
    }))
    .unwrap();
    secrets
        .create(&kube::api::PostParams::default(), &wrong)
        .await
        .unwrap();
    let set_credentials = |name: &'static str| {
        let hosts_api = hosts_api.clone();
        async move {
            hosts_api
                .patch(
                    "k-1",
                    &PatchParams::default(),
                    &Patch::Merge(&json!({ "spec": { "bmc": { "credentialsName": name } } })),
                )
                .await
                .unwrap();
        }
    };
    set_credentials("wrong-credentials").await;
    lab.lab
        .wait_host("k-1", "credentials rejected", REBOOT_TIMEOUT, |h| {
            h.status
                .as_ref()
                .and_then(|s| s.operational_status)
                .map(|s| s.as_str())
                == Some("error")
        })
        .await;
    lab.queue("k-1").await;
    let uid = lab
        .wait_entry("k-1", "reboot requested", REBOOT_TIMEOUT, |e| {
            e.status
                .as_ref()
                .and_then(|s| s.reboot.as_ref())
                .is_some_and(|r| r.requested_at.is_some())
        })
        .await
        .uid()
        .unwrap();
    let marked = lab
        .lab
        .wait_host(
            "k-1",
            "the reboot request and its marker",
            REBOOT_TIMEOUT,
            |h| {
                h.annotations().contains_key(REBOOT_ANNOTATION)
                    && h.annotations().get("hostcycle.io/reboot-queue-request") == Some(&uid)
            },
        )
        .await;
    let requested = lab
        .entry("k-1")
        .await
        .unwrap()
        .status
        .unwrap()
        .reboot
        .unwrap();
    lab.lab.kill_operator();
    lab.lab.start_operator();
    // The restarted queue sees its marker: it neither records nor sends the request again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let resumed = lab
        .entry("k-1")
        .await
        .unwrap()
        .status
        .unwrap()
        .reboot
        .unwrap();
    assert_eq!(
        resumed.requested_at, requested.requested_at,
        "not requested again"
    );
    let host = hosts_api.get("k-1").await.unwrap();
    assert_eq!(
        host.metadata.annotations, marked.metadata.annotations,
        "the request is still there, as it was"
    );
    set_credentials(common::SECRET).await;
    lab.wait_entry_gone("k-1", REBOOT_TIMEOUT).await;
    assert_eq!(lab.power_cycles("k-1").await, 1, "k-1: one power cycle");
    assert!(!cordoned(&lab.node("k-1").await), "k-1 uncordoned");

    // While the host is off. The test holds it off with its own keyed reboot annotation, so
    // the kill never lands between the host controller's record and its power-on call.
    lab.queue("k-2").await;
    let uid = lab
        .wait_phase("k-2", EntryPhase::Rebooting, REBOOT_TIMEOUT)
        .await
        .uid()
        .unwrap();
    lab.lab
        .wait_host("k-2", "the queue's reboot request", REBOOT_TIMEOUT, |h| {
            h.annotations().get("hostcycle.io/reboot-queue-request") == Some(&uid)
        })
        .await;
    lab.lab
        .annotate("k-2", "reboot.metal3.io/e2e-hold", "")
        .await;
    lab.lab
        .wait_host("k-2", "off, held, nothing in flight", REBOOT_TIMEOUT, |h| {
            let st = h.status.as_ref();
            st.and_then(|s| s.powered_on) == Some(false)
                && st
                    .and_then(|s| s.last_power_action.as_ref())
                    .is_some_and(|a| !a.is_requested())
        })
        .await;
    lab.wait_entry("k-2", "the host seen off", REBOOT_TIMEOUT, |e| {
        e.status
            .as_ref()
            .and_then(|s| s.reboot.as_ref())
            .is_some_and(|r| r.host_powered_off_at.is_some())
    })
    .await;
    lab.lab.kill_operator();
    lab.lab.start_operator();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        lab.entry("k-2").await.map(|e| e.phase()),
        Some(EntryPhase::Rebooting),
        "still waiting for the boot"
    );
    lab.lab.unannotate("k-2", "reboot.metal3.io/e2e-hold").await;
    lab.wait_entry_gone("k-2", REBOOT_TIMEOUT).await;
    assert_eq!(lab.power_cycles("k-2").await, 1, "k-2: one power cycle");
    assert!(!cordoned(&lab.node("k-2").await), "k-2 uncordoned");
}

/// A stand-in for metal3's baremetal-operator, as far as the reboot API goes: it writes
/// `status.poweredOn` from the BMC (with `lastUpdated`, in whole seconds, as metal3 stamps
/// every status write), powers a host off while the suffixless reboot annotation is present,
/// removes the annotation once the host is off, then powers it on. Like metal3 it never
/// writes `lastPoweredOn` or `pendingRebootSince`.
async fn fake_baremetal_operator(
    hosts: Api<BareMetalHost>,
    redfish: Arc<RedfishEmulator>,
    names: Vec<String>,
    stop: CancellationToken,
) {
    let mut requested: BTreeMap<String, &'static str> = BTreeMap::new();
    loop {
        for (i, name) in names.iter().enumerate() {
            let (Ok(host), Ok(power)) = (hosts.get(name).await, redfish.power_state(i).await)
            else {
                continue;
            };
            let on = power == "On";
            if host.status.as_ref().and_then(|s| s.powered_on) != Some(on) {
                // metal3 stamps every status write with `lastUpdated`, in whole seconds
                // (a `metav1.Time`).
                let now = jiff::Timestamp::now();
                let stamp = jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
                let _ = hosts
                    .patch_status(
                        name,
                        &PatchParams::default(),
                        // As metal3 reports a registered host: its power state and an
                        // operational status (a bare `poweredOn: false` is also metal3's
                        // zero value before the first observation).
                        &Patch::Merge(&json!({ "status": {
                            "poweredOn": on,
                            "operationalStatus": "OK",
                            "lastUpdated": stamp.to_string(),
                        } })),
                    )
                    .await;
            }
            let annotated = host.annotations().contains_key(REBOOT_ANNOTATION);
            let want = if annotated { "Off" } else { "On" };
            if annotated && !on {
                let _ = hosts
                    .patch(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(
                            &json!({ "metadata": { "annotations": { REBOOT_ANNOTATION: null } } }),
                        ),
                    )
                    .await;
                requested.remove(name);
                continue;
            }
            if power != want && requested.get(name) != Some(&want) {
                let reset = if want == "Off" { "ForceOff" } else { "On" };
                if redfish.reset(i, reset).await.is_ok() {
                    requested.insert(name.clone(), want);
                }
            } else if power == want {
                requested.remove(name);
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
    }
}

/// Where metal3's baremetal-operator manages the hosts, the operator runs only the queue
/// (`--controllers reboot-queue`). The host never gets a `lastPoweredOn`; the queue sees the
/// host off after the reboot began (recorded in the entry, so a restart keeps it), then on,
/// then the Node Ready with a newer heartbeat. The operator is also killed while the host is
/// off: the record survives and the entry completes with one power cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_works_with_metal3s_baremetal_operator_managing_the_hosts() {
    let hosts = [worker("m-0"), worker("m-1")];
    let options = LabOptions {
        operator_args: vec!["--controllers".into(), "reboot-queue".into()],
        wait_hosts_ok: false,
        ..LabOptions::default()
    };
    let mut lab = QueueLab::start_with(&hosts, fast_queue(), options).await;
    let stop = CancellationToken::new();
    let bmo = tokio::spawn(fake_baremetal_operator(
        lab.lab.hosts.clone(),
        lab.lab.redfish.clone(),
        hosts.iter().map(|h| h.name.to_string()).collect(),
        stop.clone(),
    ));

    lab.queue("m-0").await;
    lab.wait_entry_gone("m-0", REBOOT_TIMEOUT).await;
    assert_eq!(lab.power_cycles("m-0").await, 1, "m-0: one power cycle");

    // Killed while the host is off: hostPoweredOffAt is already recorded.
    lab.queue("m-1").await;
    lab.wait_entry("m-1", "the host seen off", REBOOT_TIMEOUT, |e| {
        e.status
            .as_ref()
            .and_then(|s| s.reboot.as_ref())
            .is_some_and(|r| r.host_powered_off_at.is_some())
    })
    .await;
    lab.lab.kill_operator();
    lab.lab.start_operator();
    lab.wait_entry_gone("m-1", REBOOT_TIMEOUT).await;
    assert_eq!(lab.power_cycles("m-1").await, 1, "m-1: one power cycle");

    for node in ["m-0", "m-1"] {
        let host = lab.lab.get(node).await;
        let provisioning = host.status.as_ref().map(|s| &s.provisioning);
        assert_eq!(
            provisioning.and_then(|p| p.last_powered_on),
            None,
            "{node}: nothing wrote lastPoweredOn (the host controller is not running)"
        );
        assert!(!cordoned(&lab.node(node).await), "{node} uncordoned");
        assert!(
            !host
                .annotations()
                .contains_key("hostcycle.io/reboot-queue-request"),
            "{node}: the request marker is cleaned up"
        );
    }
    stop.cancel();
    let _ = bmo.await;
}
