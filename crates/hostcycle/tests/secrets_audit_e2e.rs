//! Secrets audit. One lab on the real control plane runs the operator with every controller at
//! TRACE level (first text logs, then — after a graceful restart — JSON), and drives: a
//! BareMetalHost reboot through sushy-tools (Redfish) and one through the pyghmi IPMI BMC, a
//! rolling reboot of a node through the reboot queue, a remediation of a Machine
//! (`host.metal3.io/external-remediation`), a host whose Secret gets a wrong password, six
//! hosts on hostile BMCs that echo their requests back (error pages, a 401 page, reset types,
//! a reset target, a redirect and a Redfish session whose login and logout echo the password),
//! and `hostcycle bmc` runs with the password in a file and in the environment. Every BMC has
//! its own random password.
//!
//! Meanwhile every version of every object of every kind but Secrets is watched, and the
//! arguments and environment of every hostcycle process (and of their children, such as
//! ipmitool) are sampled. At the end the operator's logs, the CLI's output, the logs of the
//! simulated kubelets (in this process, at TRACE level, text and JSON), every object, Event
//! and status, and `/metrics` are searched for every password in every form a leak could
//! take (as is, JSON- or percent-encoded, base64 alone or inside a longer text, the
//! basic-auth token, a 12-character piece). The test fails listing every hit with where it
//! was found, the passwords masked.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use common::queue::{QueueLab, REBOOT_TIMEOUT, fast_queue, worker};
use common::remediation::{CYCLE_TIMEOUT, RemediationLab};
use common::{LabOptions, NS, POWER_TIMEOUT, REBOOT, create_credentials_secret, host_secret};
use futures::StreamExt;
use hostcycle_api::BareMetalHost;
use hostcycle_testkit::bmc_emulators::{FakeIpmiBmc, FakePower};
use hostcycle_testkit::echo_bmc::{EchoBmc, EchoBmcOptions, Trap};
use hostcycle_testkit::{MachineKind, wait_until};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, verbs};
use kube::runtime::watcher::{self, watcher};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// Lab hosts (sushy-tools systems with simulated kubelets).
const RF: &str = "audit-rf";
const QUEUED: &str = "audit-queued";
const REMEDIATED: &str = "audit-remediated";
const WRONG: &str = "audit-wrong";
/// Hosts the test adds: the IPMI BMC, and one per echo trap (see [`echo_host`]).
const IPMI: &str = "audit-ipmi";
const ECHO_SESSION: &str = "audit-echo-session";

/// Everything at TRACE: hostcycle, kube, reqwest, hyper, h2, rustls.
const TRACE_EVERYTHING: &str = "trace";

fn echo_host(trap: Trap) -> String {
    format!("audit-{}", trap.id())
}

// ----- the passwords and the forms a leak could take ------------------------------------

/// One BMC account of the run (no `Debug`: nothing prints a password by accident).
#[derive(Clone)]
struct Account {
    /// What it is, for the report: "audit-rf's password".
    label: String,
    user: String,
    password: String,
}

/// `head` random letters and digits, then `tail` characters mixing letters with characters
/// that JSON, URL and shell quoting change — `"`, `\`, `%` and a space, then any of
/// `/ + & = @ :` — so every encoded form differs from the raw one, while the alphanumeric head
/// survives any escaping and is searched on its own.
fn random_password(head: usize, tail: usize) -> String {
    const ALNUM: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789";
    const FIRST: &[u8] = b"\"\\% ";
    const MORE: &[u8] = b"/+&=@:";
    let alnum = || ALNUM[rand::random_range(0..ALNUM.len())] as char;
    let mut out: String = (0..head).map(|_| alnum()).collect();
    for i in 0..tail {
        let c = match (i % 2, FIRST.get(i / 2)) {
            (0, Some(first)) => *first as char,
            (0, None) => MORE[rand::random_range(0..MORE.len())] as char,
            _ => alnum(),
        };
        out.push(c);
    }
    // Never ends in a space (credentials are trimmed).
    out.push(alnum());
    out
}

/// A 24-character Redfish password; an IPMI one is at most 20 bytes.
fn account(label: &str, user: &str, ipmi: bool) -> Account {
    let password = if ipmi {
        random_password(12, 7)
    } else {
        random_password(14, 9)
    };
    Account {
        label: label.to_string(),
        user: user.to_string(),
        password,
    }
}

/// Characters of the password's alphanumeric head searched on their own: any leak of the
/// password, however escaped, encoded or cut after them, contains them.
const PIECE: usize = 12;

/// One string to look for and what finding it means.
struct Needle {
    text: String,
    account: usize,
    form: &'static str,
}

fn percent_encode(text: &str, space_as_plus: bool) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        match byte {
            b' ' if space_as_plus => out.push('+'),
            b if b.is_ascii_alphanumeric() || b"-._~".contains(&b) => out.push(b as char),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The part of base64(prefix + secret) that depends on the secret alone, for each of the three
/// alignments a secret can have inside a longer text.
fn base64_cores(secret: &[u8], engine: &base64::engine::GeneralPurpose) -> Vec<String> {
    (0..3)
        .filter_map(|offset| {
            let mut bytes = vec![b'x'; offset];
            bytes.extend_from_slice(secret);
            let encoded = engine.encode(&bytes);
            // Drop the groups that also hold prefix bytes and the last one (it depends on
            // what follows the secret).
            let start = if offset == 0 { 0 } else { 4 };
            let end = (bytes.len() / 3) * 4;
            (end > start + 8).then(|| encoded[start..end].to_string())
        })
        .collect()
}

fn needles(accounts: &[Account]) -> Vec<Needle> {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};
    let mut out = Vec::new();
    for (i, a) in accounts.iter().enumerate() {
        let p = a.password.as_str();
        let mut push = |text: String, form: &'static str| {
            if !out
                .iter()
                .any(|n: &Needle| n.account == i && n.text == text)
            {
                out.push(Needle {
                    text,
                    account: i,
                    form,
                });
            }
        };
        push(p.to_string(), "as is");
        let json = serde_json::to_string(p).unwrap();
        push(json[1..json.len() - 1].to_string(), "JSON-escaped");
        let debug = format!("{p:?}");
        push(debug[1..debug.len() - 1].to_string(), "Debug-escaped");
        push(percent_encode(p, false), "percent-encoded");
        push(percent_encode(p, true), "form-encoded");
        push(STANDARD.encode(p), "base64");
        push(URL_SAFE.encode(p), "base64url");
        push(
            STANDARD.encode(format!("{}:{p}", a.user)),
            "basic-auth token base64(user:password)",
        );
        for core in base64_cores(p.as_bytes(), &STANDARD) {
            push(core, "base64 inside a longer text");
        }
        for core in base64_cores(p.as_bytes(), &URL_SAFE) {
            push(core, "base64url inside a longer text");
        }
        push(p[..PIECE].to_string(), "a 12-character piece");
    }
    out
}

/// `text` with every needle replaced by a placeholder naming the account and form.
fn masked(text: &str, needles: &[Needle], accounts: &[Account]) -> String {
    let mut out = text.to_string();
    // Longest first, so a piece does not split a longer form.
    let mut order: Vec<&Needle> = needles.iter().collect();
    order.sort_by_key(|n| std::cmp::Reverse(n.text.len()));
    for n in order {
        if out.contains(&n.text) {
            out = out.replace(
                &n.text,
                &format!("<{} ({})>", accounts[n.account].label, n.form),
            );
        }
    }
    out
}

/// A secret found somewhere.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Hit {
    source: String,
    account: String,
    form: &'static str,
    /// The text around the hit, every password masked.
    excerpt: String,
}

/// Searches texts for the accounts' passwords and keeps what it found and what it searched.
struct Auditor {
    accounts: Vec<Account>,
    needles: Vec<Needle>,
    hits: Mutex<Vec<Hit>>,
    /// Texts searched (and their bytes), by kind of source.
    searched: Mutex<BTreeMap<String, (u64, u64)>>,
}

impl Auditor {
    fn new(accounts: Vec<Account>) -> Auditor {
        Auditor {
            needles: needles(&accounts),
            accounts,
            hits: Mutex::default(),
            searched: Mutex::default(),
        }
    }

    /// Searches `text` found at `source` (of kind `kind`, for the coverage count).
    fn scan(&self, kind: &str, source: &str, text: &str) {
        {
            let mut searched = self.searched.lock().unwrap();
            let entry = searched.entry(kind.to_string()).or_default();
            entry.0 += 1;
            entry.1 += text.len() as u64;
        }
        let mut found = Vec::new();
        for n in &self.needles {
            let mut from = 0;
            // At most a few hits per needle and text: the report needs where, not how often.
            let mut count = 0;
            while let Some(at) = text[from..].find(&n.text) {
                let at = from + at;
                found.push(Hit {
                    source: source.to_string(),
                    account: self.accounts[n.account].label.clone(),
                    form: n.form,
                    excerpt: self.excerpt(text, at, n.text.len()),
                });
                from = at + n.text.len();
                count += 1;
                if count == 3 {
                    break;
                }
            }
        }
        if !found.is_empty() {
            self.hits.lock().unwrap().extend(found);
        }
    }

    /// Scans a log or output line by line, naming the line.
    fn scan_lines(&self, kind: &str, source: &str, text: &str) {
        self.count(kind, text.len());
        let mut found = Vec::new();
        for n in &self.needles {
            if !text.contains(&n.text) {
                continue;
            }
            for (number, line) in text.lines().enumerate() {
                if let Some(at) = line.find(&n.text) {
                    found.push(Hit {
                        source: format!("{source}, line {}", number + 1),
                        account: self.accounts[n.account].label.clone(),
                        form: n.form,
                        excerpt: self.excerpt(line, at, n.text.len()),
                    });
                }
            }
        }
        if !found.is_empty() {
            self.hits.lock().unwrap().extend(found);
        }
    }

    fn count(&self, kind: &str, bytes: usize) {
        let mut searched = self.searched.lock().unwrap();
        let entry = searched.entry(kind.to_string()).or_default();
        entry.0 += 1;
        entry.1 += bytes as u64;
    }

    fn excerpt(&self, text: &str, at: usize, len: usize) -> String {
        let mut start = at.saturating_sub(100);
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (at + len + 100).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        masked(&text[start..end], &self.needles, &self.accounts)
    }

    fn searched(&self) -> BTreeMap<String, (u64, u64)> {
        self.searched.lock().unwrap().clone()
    }

    /// The hits grouped by source kind, account and form, with a few examples each.
    fn report(&self) -> Option<String> {
        let hits = self.hits.lock().unwrap().clone();
        if hits.is_empty() {
            return None;
        }
        let mut groups: BTreeMap<(String, String, &'static str), Vec<Hit>> = BTreeMap::new();
        for h in hits.iter() {
            // Group "operator log hostcycle-operator-1.log, line 12" by its file.
            let place = h.source.split(", line").next().unwrap_or(&h.source);
            let place = place.split(" (resourceVersion").next().unwrap_or(place);
            groups
                .entry((place.to_string(), h.account.clone(), h.form))
                .or_default()
                .push(h.clone());
        }
        let mut out = format!(
            "{} BMC password hit(s) in {} place(s):\n",
            hits.len(),
            groups.len()
        );
        for ((place, account, form), hits) in groups {
            out.push_str(&format!(
                "\n- {place}: {account} ({form}), {} time(s); e.g. at {}:\n    {}\n",
                hits.len(),
                hits[0].source,
                hits[0].excerpt.replace('\n', "\\n")
            ));
        }
        Some(out)
    }
}

// ----- in-process logs (the simulated kubelets) -----------------------------------------

/// A tracing writer into memory.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}

impl LogBuffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// This process's logs (the simulated kubelets and their BMC drivers, the HTTP stack under
/// them) at TRACE level, in text and JSON; INFO and up also to the test's output.
fn capture_logs() -> (LogBuffer, LogBuffer) {
    let text = LogBuffer::default();
    let json = LogBuffer::default();
    let filter = || {
        EnvFilter::new(
            "info,hostcycle_sim=trace,hostcycle_bmc=trace,reqwest=trace,hyper=trace,\
             hyper_util=trace,rustls=trace",
        )
    };
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(text.clone())
                .with_ansi(false)
                .with_filter(filter()),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_writer(json.clone())
                .with_filter(filter()),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(EnvFilter::new("info,kube_client=off")),
        )
        .try_init();
    (text, json)
}

// ----- processes -------------------------------------------------------------------------

/// What a process was seen with.
#[derive(Clone, Debug)]
struct ProcessSample {
    what: String,
    pid: u32,
    argv: Vec<String>,
    environ: Vec<String>,
}

fn nul_separated(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// The process's argv and environment, if it still runs (a zombie has neither), read as one
/// consistent sample: the arguments are read again after the environment, and a process that
/// changed in between (it was exec'ing: the arguments of one image, the environment of the
/// next) is read again. A process that never holds still is left to the next sampling round.
fn read_process(pid: u32) -> Option<(Vec<String>, Vec<String>)> {
    for _ in 0..5 {
        let argv = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let argv_after = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        if argv != argv_after {
            continue;
        }
        let argv = nul_separated(&argv);
        return (!argv.is_empty()).then(|| (argv, nul_separated(&environ)));
    }
    None
}

/// Direct children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// Samples by (pid, argv).
type SamplesByImage = BTreeMap<(u32, Vec<String>), ProcessSample>;

/// Samples hostcycle processes and their descendants every 20 ms while the test runs.
#[derive(Clone, Default)]
struct ProcessWatch {
    /// (what, pid, whether its children are sampled too).
    roots: Arc<Mutex<Vec<(String, u32, bool)>>>,
    /// By (pid, argv): a process is kept once per program image it ran.
    samples: Arc<Mutex<SamplesByImage>>,
}

impl ProcessWatch {
    /// Samples `pid` and its descendants.
    fn watch(&self, what: &str, pid: u32) {
        self.roots
            .lock()
            .unwrap()
            .push((what.to_string(), pid, true));
        self.sample_tree();
    }

    /// Samples `pid` alone (this test's children are emulators and the control plane; the
    /// hostcycle processes among them are watched on their own).
    fn watch_alone(&self, what: &str, pid: u32) {
        self.roots
            .lock()
            .unwrap()
            .push((what.to_string(), pid, false));
        self.sample_tree();
    }

    fn forget(&self, pid: u32) {
        self.roots.lock().unwrap().retain(|(_, p, _)| *p != pid);
    }

    fn sample_tree(&self) {
        let roots = self.roots.lock().unwrap().clone();
        for (what, root, descend) in roots {
            let mut stack = vec![(what, root)];
            while let Some((what, pid)) = stack.pop() {
                if let Some((argv, environ)) = read_process(pid) {
                    let key = (pid, argv.clone());
                    self.samples
                        .lock()
                        .unwrap()
                        .entry(key)
                        .or_insert_with(|| ProcessSample {
                            what: what.clone(),
                            pid,
                            argv,
                            environ,
                        });
                }
                if descend {
                    for child in children(pid) {
                        stack.push((format!("child of {what}"), child));
                    }
                }
            }
        }
    }

    /// Samples on a thread of its own (never holding up the runtime's shutdown) until
    /// `stop` is cancelled.
    fn start(&self, stop: CancellationToken) {
        let me = self.clone();
        std::thread::spawn(move || {
            while !stop.is_cancelled() {
                me.sample_tree();
                std::thread::sleep(Duration::from_millis(20));
            }
        });
    }

    fn samples(&self) -> Vec<ProcessSample> {
        self.samples.lock().unwrap().values().cloned().collect()
    }
}

/// The environment variables through which a process is handed its password on purpose:
/// only the one `hostcycle bmc` reads (this test passes it to some runs). ipmitool gets its
/// password through a pipe on its stdin, never its environment: other processes of the
/// operator's user (reboot commands) could read that in /proc/PID/environ.
fn password_channels(sample: &ProcessSample) -> &'static [&'static str] {
    if sample.what.contains("hostcycle bmc")
        && sample
            .argv
            .first()
            .is_some_and(|a| a == env!("CARGO_BIN_EXE_hostcycle"))
    {
        // The CLI itself, or a child of it between fork and exec (it still has the
        // parent's image and environment; ipmitool gets a cleared one at exec).
        &["HOSTCYCLE_BMC_PASSWORD="]
    } else {
        &[]
    }
}

fn audit_process(auditor: &Auditor, sample: &ProcessSample) {
    let channels = password_channels(sample);
    let name = format!(
        "{} (pid {}, {})",
        sample.what,
        sample.pid,
        sample.argv.first().map(String::as_str).unwrap_or("?")
    );
    auditor.scan(
        "process arguments",
        &format!("arguments of {name}"),
        &sample.argv.join(" "),
    );
    let environ: Vec<&String> = sample
        .environ
        .iter()
        .filter(|v| !channels.iter().any(|c| v.starts_with(c)))
        .collect();
    auditor.scan(
        "process environments",
        &format!("environment of {name}"),
        &environ
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
    );
}

// ----- objects ---------------------------------------------------------------------------

/// Watches every version of every object of every listable kind but Secrets, and searches
/// each as it arrives. Returns the kinds watched.
async fn watch_all_objects(
    client: kube::Client,
    auditor: Arc<Auditor>,
    stop: CancellationToken,
) -> Vec<String> {
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let mut kinds = Vec::new();
    let mut listed = Vec::new();
    for group in discovery.groups() {
        for (resource, capabilities) in group.recommended_resources() {
            if resource.plural == "secrets"
                || !capabilities.supports_operation(verbs::WATCH)
                || !capabilities.supports_operation(verbs::LIST)
            {
                continue;
            }
            kinds.push(format!("{}/{}", resource.group, resource.kind));
            // Cluster-wide for namespaced kinds too: every namespace.
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            listed.push(rx);
            tokio::spawn(watch_kind(api, resource, auditor.clone(), stop.clone(), tx));
        }
    }
    for rx in listed {
        let _ = tokio::time::timeout(Duration::from_secs(30), rx).await;
    }
    kinds
}

async fn watch_kind(
    api: Api<DynamicObject>,
    resource: ApiResource,
    auditor: Arc<Auditor>,
    stop: CancellationToken,
    listed: tokio::sync::oneshot::Sender<()>,
) {
    let mut listed = Some(listed);
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            event = stream.next() => event,
        };
        let Some(event) = event else { return };
        let object = match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
            Ok(watcher::Event::Delete(o)) => o,
            Ok(watcher::Event::InitDone) => {
                if let Some(tx) = listed.take() {
                    let _ = tx.send(());
                }
                continue;
            }
            _ => continue,
        };
        scan_object(&auditor, &resource, &object);
    }
}

fn scan_object(auditor: &Auditor, resource: &ApiResource, object: &DynamicObject) {
    let text = serde_json::to_string(object).unwrap_or_default();
    let name = match object.namespace() {
        Some(ns) => format!("{ns}/{}", object.name_any()),
        None => object.name_any(),
    };
    auditor.scan(
        &format!("objects: {}", resource.kind),
        &format!(
            "{} {name} (resourceVersion {})",
            resource.kind,
            object.resource_version().unwrap_or_default()
        ),
        &text,
    );
}

/// Lists every object of every listable kind but Secrets once more (the final state).
async fn sweep_all_objects(client: &kube::Client, auditor: &Auditor) -> BTreeMap<String, usize> {
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let mut counts = BTreeMap::new();
    for group in discovery.groups() {
        for (resource, capabilities) in group.recommended_resources() {
            if resource.plural == "secrets" || !capabilities.supports_operation(verbs::LIST) {
                continue;
            }
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let Ok(list) = api.list(&ListParams::default()).await else {
                continue;
            };
            for object in &list.items {
                scan_object(auditor, &resource, object);
            }
            *counts.entry(resource.kind.clone()).or_default() += list.items.len();
        }
    }
    counts
}

// ----- hostcycle bmc ----------------------------------------------------------------------

/// One `hostcycle bmc` run.
struct CliRun {
    name: &'static str,
    args: Vec<String>,
    /// The password in `HOSTCYCLE_BMC_PASSWORD` (else a `--password-file` is in `args`).
    password_env: Option<String>,
    log_format: &'static str,
}

struct CliResult {
    success: bool,
    output: String,
}

async fn run_cli(run: &CliRun, processes: &ProcessWatch) -> CliResult {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_hostcycle"));
    command
        .arg("--log-format")
        .arg(run.log_format)
        .arg("bmc")
        .args(&run.args)
        .env("RUST_LOG", TRACE_EVERYTHING)
        .env_remove("HOSTCYCLE_BMC_PASSWORD")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(password) = &run.password_env {
        command.env("HOSTCYCLE_BMC_PASSWORD", password);
    }
    let child = command.spawn().unwrap();
    let pid = child.id().unwrap();
    processes.watch(&format!("hostcycle bmc ({})", run.name), pid);
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("hostcycle bmc ({}) did not end within 60 s", run.name))
        .unwrap();
    processes.forget(pid);
    CliResult {
        success: output.status.success(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

fn write_password_file(dir: &Path, name: &str, password: &str) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(f, "{password}").unwrap();
    path
}

// ----- the operator -----------------------------------------------------------------------

/// Stops the operator with SIGTERM (it logs out of its BMCs) and waits for it to exit.
fn stop_operator_gracefully(lab: &mut RemediationLab, processes: &ProcessWatch) {
    if let Some(mut p) = lab.q.lab.operator.take() {
        processes.forget(p.pid());
        p.stop();
    }
}

fn watch_operator(lab: &RemediationLab, processes: &ProcessWatch, what: &str) {
    let pid = lab.lab.operator.as_ref().unwrap().pid();
    processes.watch(what, pid);
}

async fn wait_operator_ready(lab: &RemediationLab) {
    let http = hostcycle_testkit::http::client(None).unwrap();
    let url = format!("http://127.0.0.1:{}/readyz", lab.lab.probe_port);
    wait_until(
        "the restarted operator to be ready",
        Duration::from_secs(60),
        || async {
            http.get(&url)
                .send()
                .await
                .ok()?
                .status()
                .is_success()
                .then_some(())
        },
    )
    .await
    .unwrap();
}

fn operational_status(h: &BareMetalHost) -> String {
    h.status
        .as_ref()
        .and_then(|s| s.operational_status)
        .map(|s| s.as_str().to_string())
        .unwrap_or_default()
}

fn error_message(h: &BareMetalHost) -> String {
    h.status
        .as_ref()
        .map(|s| s.error_message.clone())
        .unwrap_or_default()
}

async fn wait_error(lab: &RemediationLab, host: &str, what: &str, contains: &'static str) {
    lab.lab
        .wait_host(host, what, POWER_TIMEOUT, move |h| {
            operational_status(h) == "error" && error_message(h).contains(contains)
        })
        .await;
}

async fn add_host(lab: &RemediationLab, name: &str, address: &str, a: &Account) {
    create_credentials_secret(&lab.client, &host_secret(name), &a.user, &a.password).await;
    let bmh = BareMetalHost::externally_provisioned(name, address, &host_secret(name));
    lab.lab
        .hosts
        .create(&PostParams::default(), &bmh)
        .await
        .unwrap();
}

/// A reboot through the reboot API: annotate, wait until done.
async fn reboot(lab: &RemediationLab, host: &str) {
    lab.lab.annotate(host, REBOOT, "").await;
    lab.lab.wait_reboot_done(host).await;
}

// ----- the test ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_bmc_password_leaks_anywhere_after_a_full_run() {
    let started = std::time::Instant::now();
    let (sim_text_log, sim_json_log) = capture_logs();

    // Every BMC account of the run, each password unique.
    let mut accounts: BTreeMap<String, Account> = BTreeMap::new();
    for host in [RF, QUEUED, REMEDIATED, WRONG] {
        accounts.insert(
            host.to_string(),
            account(&format!("{host}'s password"), &format!("u-{host}"), false),
        );
    }
    accounts.insert(
        IPMI.to_string(),
        account(&format!("{IPMI}'s password"), "u-ipmi", true),
    );
    for trap in Trap::ALL {
        let host = echo_host(trap);
        accounts.insert(
            host.clone(),
            account(&format!("{host}'s password"), &format!("u-{host}"), false),
        );
    }
    accounts.insert(
        ECHO_SESSION.to_string(),
        account(&format!("{ECHO_SESSION}'s password"), "u-session", false),
    );
    // The wrong password the Secret of WRONG gets later (a typo is a secret too).
    let wrong = account(
        &format!("{WRONG}'s wrong password"),
        &format!("u-{WRONG}"),
        false,
    );
    let mut audited: Vec<Account> = accounts.values().cloned().collect();
    audited.push(wrong.clone());
    audited.push(Account {
        label: "the lab's shared password".into(),
        user: common::USER.into(),
        password: common::PASSWORD.into(),
    });
    let auditor = Arc::new(Auditor::new(audited));

    // BMCs outside the lab's emulator.
    let ipmi = FakeIpmiBmc::start(
        &accounts[IPMI].user,
        &accounts[IPMI].password,
        FakePower::On,
    )
    .await
    .unwrap();
    let echo = EchoBmc::start(EchoBmcOptions::default()).await.unwrap();
    let echo_sessions = EchoBmc::start(EchoBmcOptions { sessions: true })
        .await
        .unwrap();

    let options = LabOptions {
        operator_env: vec![("RUST_LOG".into(), TRACE_EVERYTHING.into())],
        host_credentials: [RF, QUEUED, REMEDIATED, WRONG]
            .iter()
            .map(|h| {
                let a = &accounts[*h];
                (h.to_string(), (a.user.clone(), a.password.clone()))
            })
            .collect(),
        ..LabOptions::default()
    };
    let hosts = [
        worker(RF),
        worker(QUEUED),
        worker(REMEDIATED),
        worker(WRONG),
    ];
    let mut lab = RemediationLab {
        q: QueueLab::start_with(&hosts, fast_queue(), options).await,
    };
    println!("lab up after {:?}", started.elapsed());

    let stop = CancellationToken::new();
    let processes = ProcessWatch::default();
    processes.start(stop.clone());
    processes.watch_alone(
        "this test process (the simulated kubelets)",
        std::process::id(),
    );
    watch_operator(&lab, &processes, "hostcycle operator (text logs)");
    let kinds = watch_all_objects(lab.client.clone(), auditor.clone(), stop.clone()).await;
    println!(
        "watching {} kinds after {:?}",
        kinds.len(),
        started.elapsed()
    );

    // The hosts outside the lab's emulator.
    add_host(&lab, IPMI, &ipmi.address(), &accounts[IPMI]).await;
    for trap in Trap::ALL {
        let host = echo_host(trap);
        add_host(&lab, &host, &echo.address(trap), &accounts[&host]).await;
    }
    add_host(
        &lab,
        ECHO_SESSION,
        &echo_sessions.address(Trap::ErrorPage),
        &accounts[ECHO_SESSION],
    )
    .await;
    lab.namespace("openshift-machine-api", &[]).await;
    let machine = lab
        .create_machine(
            MachineKind::OpenShift,
            "openshift-machine-api",
            "audit-machine",
            REMEDIATED,
            REMEDIATED,
            &[],
        )
        .await;

    // ----- phase 1: everything at once, text logs ------------------------------------
    let secrets: Api<Secret> = Api::namespaced(lab.client.clone(), NS);
    let [
        page_host,
        unauthorized_host,
        types_host,
        target_host,
        redirect_host,
    ] = Trap::ALL.map(echo_host);
    let flows = async {
        tokio::join!(
            async {
                reboot(&lab, RF).await;
            },
            async {
                lab.lab
                    .wait_host(IPMI, "on and OK", POWER_TIMEOUT, |h| {
                        operational_status(h) == "OK"
                    })
                    .await;
                reboot(&lab, IPMI).await;
            },
            async {
                lab.queue(QUEUED).await;
                lab.wait_entry_gone(QUEUED, REBOOT_TIMEOUT).await;
            },
            async {
                let old_uid = lab.node(REMEDIATED).await.uid().unwrap();
                lab.mark(&machine).await;
                lab.wait_node_back(REMEDIATED, &old_uid, CYCLE_TIMEOUT)
                    .await;
                lab.wait_machine_clean(&machine, CYCLE_TIMEOUT).await;
            },
            async {
                // The Secret gets a wrong password: the operator reports it without it.
                let patch = json!({ "stringData": { "password": wrong.password } });
                secrets
                    .patch(
                        &host_secret(WRONG),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .unwrap();
                wait_error(
                    &lab,
                    WRONG,
                    "credentials rejected",
                    "rejected the credentials",
                )
                .await;
            },
            async {
                lab.lab
                    .wait_host(&types_host, "on and OK", POWER_TIMEOUT, |h| {
                        operational_status(h) == "OK"
                    })
                    .await;
                reboot(&lab, &types_host).await;
            },
            async {
                lab.lab
                    .wait_host(&target_host, "on and OK", POWER_TIMEOUT, |h| {
                        operational_status(h) == "OK"
                    })
                    .await;
                lab.lab.annotate(&target_host, REBOOT, "").await;
                wait_error(
                    &lab,
                    &target_host,
                    "the reset failing",
                    "ComputerSystem.Reset",
                )
                .await;
            },
            wait_error(&lab, &page_host, "the echoed 500", "HTTP 500"),
            wait_error(
                &lab,
                &unauthorized_host,
                "the echoed 401",
                "rejected the credentials"
            ),
            wait_error(&lab, &redirect_host, "the echoed 500", "HTTP 500"),
            wait_error(&lab, ECHO_SESSION, "the echoed 500", "HTTP 500"),
        )
    };
    flows.await;
    println!("phase 1 flows done after {:?}", started.elapsed());

    // ----- hostcycle bmc --------------------------------------------------------------
    let files = tempfile::Builder::new()
        .prefix("i10-audit-")
        .tempdir()
        .unwrap();
    let file_for = |host: &str, password: &str| {
        write_password_file(files.path(), &format!("{host}.pw"), password)
            .display()
            .to_string()
    };
    let connection = |address: String, user: &str, file: Option<String>| {
        let mut args = vec![
            "--address".to_string(),
            address,
            "--username".to_string(),
            user.to_string(),
            "--request-timeout".to_string(),
            "3s".to_string(),
        ];
        if let Some(file) = file {
            args.extend(["--password-file".to_string(), file]);
        }
        args
    };
    let rf_address = lab.lab.redfish.system_address(lab.lab.index(RF)).unwrap();
    let wrong_address = lab
        .lab
        .redfish
        .system_address(lab.lab.index(WRONG))
        .unwrap();
    let with = |command: &[&str], rest: Vec<String>| -> Vec<String> {
        command.iter().map(|s| s.to_string()).chain(rest).collect()
    };
    let rf = &accounts[RF];
    let ipmi_account = &accounts[IPMI];
    let types = &accounts[&echo_host(Trap::ResetTypes)];
    let target = &accounts[&echo_host(Trap::ResetTarget)];
    let page = &accounts[&echo_host(Trap::ErrorPage)];
    let redirect = &accounts[&echo_host(Trap::Redirect)];
    let session = &accounts[ECHO_SESSION];
    let cli_runs = vec![
        (
            CliRun {
                name: "Redfish status, password file, JSON logs",
                args: with(
                    &["status", "-o", "json"],
                    connection(
                        rf_address.clone(),
                        &rf.user,
                        Some(file_for(RF, &rf.password)),
                    ),
                ),
                password_env: None,
                log_format: "json",
            },
            true,
        ),
        (
            CliRun {
                name: "IPMI status, password in the environment",
                args: with(
                    &["status"],
                    connection(ipmi.address(), &ipmi_account.user, None),
                ),
                password_env: Some(ipmi_account.password.clone()),
                log_format: "text",
            },
            true,
        ),
        (
            CliRun {
                name: "wrong password",
                args: with(
                    &["status"],
                    connection(
                        wrong_address,
                        &wrong.user,
                        Some(file_for("wrong", &wrong.password)),
                    ),
                ),
                password_env: None,
                log_format: "text",
            },
            false,
        ),
        (
            CliRun {
                name: "echoed error page",
                args: with(
                    &["status"],
                    connection(echo.address(Trap::ErrorPage), &page.user, None),
                ),
                password_env: Some(page.password.clone()),
                log_format: "json",
            },
            false,
        ),
        (
            CliRun {
                name: "echoing redirect",
                args: with(
                    &["status"],
                    connection(
                        echo.address(Trap::Redirect),
                        &redirect.user,
                        Some(file_for("redirect", &redirect.password)),
                    ),
                ),
                password_env: None,
                log_format: "text",
            },
            false,
        ),
        (
            CliRun {
                name: "echoing session login and logout",
                args: with(
                    &["status"],
                    connection(
                        echo_sessions.address(Trap::ErrorPage),
                        &session.user,
                        Some(file_for("session", &session.password)),
                    ),
                ),
                password_env: None,
                log_format: "text",
            },
            false,
        ),
        (
            CliRun {
                name: "hard off at an echoed reset target",
                args: with(
                    &["off", "--hard", "--wait-timeout", "5s"],
                    connection(
                        echo.address(Trap::ResetTarget),
                        &target.user,
                        Some(file_for("target", &target.password)),
                    ),
                ),
                password_env: None,
                log_format: "json",
            },
            false,
        ),
        (
            CliRun {
                name: "soft off with echoed reset types",
                args: with(
                    &["off", "--wait-timeout", "20s", "--poll-interval", "200ms"],
                    connection(
                        echo.address_of(Trap::ResetTypes, "cli"),
                        &types.user,
                        Some(file_for("types", &types.password)),
                    ),
                ),
                password_env: None,
                log_format: "text",
            },
            true,
        ),
        (
            CliRun {
                name: "help with the password in the environment",
                args: vec!["status".into(), "--help".into()],
                password_env: Some(rf.password.clone()),
                log_format: "text",
            },
            true,
        ),
    ];
    let results =
        futures::future::join_all(cli_runs.iter().map(|(run, _)| run_cli(run, &processes))).await;
    let mut cli_outputs = Vec::new();
    for ((run, should_succeed), result) in cli_runs.iter().zip(results) {
        assert_eq!(
            result.success,
            *should_succeed,
            "hostcycle bmc ({}): expected {}; output:\n{}",
            run.name,
            if *should_succeed {
                "success"
            } else {
                "failure"
            },
            masked(&result.output, &auditor.needles, &auditor.accounts)
        );
        cli_outputs.push((run.name, result.output));
    }
    println!("hostcycle bmc runs done after {:?}", started.elapsed());

    // ----- phase 2: a graceful restart (logouts), JSON logs -------------------------
    let metrics_text = lab.lab.metrics().await;
    auditor.scan(
        "metrics",
        "/metrics of the operator (text logs)",
        &metrics_text,
    );
    stop_operator_gracefully(&mut lab, &processes);
    lab.lab.set_operator_env("HOSTCYCLE_LOG_FORMAT", "json");
    lab.lab.start_operator();
    watch_operator(&lab, &processes, "hostcycle operator (JSON logs)");
    wait_operator_ready(&lab).await;
    tokio::join!(
        reboot(&lab, RF),
        reboot(&lab, IPMI),
        reboot(&lab, &types_host),
        async {
            // Each failing host is tried (and fails) again: the new log names it.
            let log = lab.lab.operator.as_ref().unwrap().log_path().to_path_buf();
            for host in [
                page_host.as_str(),
                unauthorized_host.as_str(),
                redirect_host.as_str(),
                target_host.as_str(),
                ECHO_SESSION,
                WRONG,
            ] {
                let needle = format!("/{host}.{NS}");
                wait_until(
                    &format!("the restarted operator's log to name {host}"),
                    POWER_TIMEOUT,
                    || async {
                        std::fs::read_to_string(&log)
                            .ok()?
                            .contains(&needle)
                            .then_some(())
                    },
                )
                .await
                .unwrap();
            }
        },
    );
    let metrics_json = lab.lab.metrics().await;
    auditor.scan(
        "metrics",
        "/metrics of the operator (JSON logs)",
        &metrics_json,
    );
    stop_operator_gracefully(&mut lab, &processes);
    println!("phase 2 done after {:?}", started.elapsed());

    // ----- the audit ------------------------------------------------------------------
    // Let the watches deliver the last writes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let swept = sweep_all_objects(&lab.client, &auditor).await;
    stop.cancel();

    let log_dir = lab.lab.cluster.log_dir();
    let mut operator_logs = Vec::new();
    for entry in std::fs::read_dir(&log_dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("hostcycle-") {
            let text = std::fs::read_to_string(entry.path()).unwrap();
            auditor.scan_lines("operator logs", &format!("operator log {name}"), &text);
            operator_logs.push((name, text.len()));
        }
    }
    for (name, output) in &cli_outputs {
        auditor.scan_lines(
            "hostcycle bmc output",
            &format!("output of hostcycle bmc ({name})"),
            output,
        );
    }
    auditor.scan_lines(
        "in-process logs",
        "simulated kubelets' log (text)",
        &sim_text_log.text(),
    );
    auditor.scan_lines(
        "in-process logs",
        "simulated kubelets' log (JSON)",
        &sim_json_log.text(),
    );
    let samples = processes.samples();
    for sample in &samples {
        audit_process(&auditor, sample);
    }

    // The traps were sprung: each echo BMC was sent its host's password (so it repeated it).
    let sent = echo.passwords_by_trap();
    for trap in Trap::ALL {
        let host = echo_host(trap);
        assert!(
            sent.get(&Some(trap))
                .is_some_and(|p| p.contains(&accounts[&host].password)),
            "the echo BMC was never sent {host}'s password"
        );
    }
    let session_sent: BTreeSet<String> = echo_sessions
        .passwords_by_trap()
        .into_values()
        .flatten()
        .collect();
    assert!(
        session_sent.contains(&session.password),
        "the session echo BMC was never sent {ECHO_SESSION}'s password"
    );
    assert!(echo_sessions.logins() >= 2, "sessions were opened");
    // What the audit covered.
    let ipmitool_runs = samples
        .iter()
        .filter(|s| s.argv.first().is_some_and(|a| a.ends_with("ipmitool")))
        .count();
    let searched = auditor.searched();
    println!("operator logs: {operator_logs:?}");
    println!("searched (texts, bytes) by kind: {searched:#?}");
    println!(
        "processes sampled: {} ({} ipmitool runs); objects in the final sweep: {}",
        samples.len(),
        ipmitool_runs,
        swept.values().sum::<usize>()
    );
    for kind in [
        "objects: BareMetalHost",
        "objects: Event",
        "objects: RebootQueue",
        "objects: RebootQueueEntry",
        "objects: Machine",
        "objects: Node",
        "operator logs",
        "hostcycle bmc output",
        "in-process logs",
        "metrics",
        "process arguments",
        "process environments",
    ] {
        assert!(
            searched.get(kind).is_some_and(|(n, _)| *n > 0),
            "nothing searched of {kind}: {searched:?}"
        );
    }
    assert!(
        ipmitool_runs > 0,
        "no ipmitool run of the operator was sampled"
    );
    assert_eq!(
        operator_logs.len(),
        2,
        "two operator runs logged: {operator_logs:?}"
    );

    if let Some(report) = auditor.report() {
        panic!("BMC passwords leaked:\n{report}");
    }
    println!(
        "no BMC password found in any of the above; took {:?}",
        started.elapsed()
    );
}

/// The scanner itself: every form a leak could take is found, and the report masks it.
#[test]
fn the_scanner_finds_every_form_and_masks_it() {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    let a = account("the test's password", "u-test", false);
    let p = a.password.clone();
    let json = serde_json::to_string(&p).unwrap();
    let leaks = [
        format!("error: {p} (end)"),
        format!("{{\"message\":{json}}}"),
        format!("GET /x/{}", percent_encode(&p, false)),
        format!("body=a&pw={}", percent_encode(&p, true)),
        format!(
            "Authorization: Basic {}",
            STANDARD.encode(format!("u-test:{p}"))
        ),
        format!("data: {}", STANDARD.encode(format!("a{p}b"))),
        format!("data: {}", STANDARD.encode(format!("ab{p}"))),
        format!("data: {}", URL_SAFE_NO_PAD.encode(format!("abc{p}xyz"))),
        format!("cut: {}… (truncated)", &p[..PIECE + 1]),
    ];
    let auditor = Auditor::new(vec![a]);
    for (i, leak) in leaks.iter().enumerate() {
        auditor.scan("test", &format!("leak {i}"), leak);
        auditor.scan_lines("test lines", &format!("log {i}"), &format!("x\n{leak}\ny"));
    }
    auditor.scan("test", "clean", "nothing to see: e2e-password-like text");
    let hits = auditor.hits.lock().unwrap().clone();
    for (i, leak) in leaks.iter().enumerate() {
        for source in [format!("leak {i}"), format!("log {i}, line 2")] {
            assert!(
                hits.iter().any(|h| h.source == source),
                "no hit for {source}: {}",
                masked(leak, &auditor.needles, &auditor.accounts)
            );
        }
    }
    assert!(!hits.iter().any(|h| h.source == "clean"));
    let report = auditor.report().unwrap();
    assert!(!report.contains(&p[..PIECE]), "the report masks: {report}");
    assert!(report.contains("<the test's password ("), "{report}");
}
