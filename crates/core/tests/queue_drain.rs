//! Drain rules of the reboot queue, as tables: which pods a drain evicts, deletes, skips or
//! stops at; what an eviction's answer leads to; when a drain is done or timed out; how long
//! a failed drain backs off.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use hostcycle_api::queue::RebootQueueSpec;
use hostcycle_core::queue::drain::{
    DrainProgress, DrainWork, EvictionAnswer, EvictionStep, PodDisposition, PodView, SkipReason,
    after_dry_run, after_eviction, backoff_delay, classify_pod, drain_deadline, drain_progress,
    drain_work, job_pod_blockers, namespace_protected, next_backoff,
};
use hostcycle_core::queue::{BackoffConfig, QueueConfig};
use hostcycle_core::time::{add, elapsed};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_750_000_000 + s).unwrap()
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

type Labels = BTreeMap<String, String>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A running pod of a ReplicaSet in namespace `app`.
fn pod(name: &str) -> PodView {
    PodView {
        namespace: "app".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        phase: "Running".into(),
        controller_kind: Some("ReplicaSet".into()),
        mirror: false,
        terminating: false,
        labels: BTreeMap::new(),
    }
}

trait PodBuild {
    fn owner(self, kind: Option<&str>) -> Self;
    fn job(self) -> Self;
    fn phase(self, phase: &str) -> Self;
    fn mirror(self) -> Self;
    fn terminating(self) -> Self;
    fn label(self, key: &str, value: &str) -> Self;
}

impl PodBuild for PodView {
    fn owner(mut self, kind: Option<&str>) -> Self {
        self.controller_kind = kind.map(str::to_string);
        self
    }
    fn job(self) -> Self {
        self.owner(Some("Job"))
    }
    fn phase(mut self, phase: &str) -> Self {
        self.phase = phase.into();
        self
    }
    fn mirror(mut self) -> Self {
        self.mirror = true;
        self
    }
    fn terminating(mut self) -> Self {
        self.terminating = true;
        self
    }
    fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }
}

fn match_labels(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(pairs)),
        match_expressions: None,
    }
}

fn expression(key: &str, operator: &str, values: &[&str]) -> LabelSelector {
    LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }]),
    }
}

// ---------------------------------------------------------------------------------------
// Pods.

#[test]
fn classify_pod_skips_daemonsets_mirrors_and_idle_jobs_and_protects_running_jobs() {
    let critical = match_labels(&[("batch", "critical")]);
    let empty = LabelSelector::default();
    let unusable = expression("batch", "Gt", &["1"]);
    let in_without_values = expression("batch", "In", &[]);
    use PodDisposition::*;
    #[rustfmt::skip]
    let cases: Vec<(&str, PodView, Option<&LabelSelector>, PodDisposition)> = vec![
        ("ReplicaSet pod is evicted", pod("a"), None, Evict),
        ("StatefulSet pod is evicted", pod("a").owner(Some("StatefulSet")), None, Evict),
        ("bare pod (no controller) is evicted", pod("a").owner(None), None, Evict),
        ("DaemonSet pod is skipped", pod("a").owner(Some("DaemonSet")), None, Skip(SkipReason::DaemonSet)),
        ("terminating DaemonSet pod is skipped", pod("a").owner(Some("DaemonSet")).terminating(), None, Skip(SkipReason::DaemonSet)),
        ("mirror pod is skipped", pod("a").owner(Some("Node")).mirror(), None, Skip(SkipReason::Mirror)),
        ("mirror wins over any owner", pod("a").owner(Some("Job")).mirror(), None, Skip(SkipReason::Mirror)),
        ("Pending Job pod is skipped", pod("a").job().phase("Pending"), None, Skip(SkipReason::JobNotRunning)),
        ("Succeeded Job pod is skipped", pod("a").job().phase("Succeeded"), None, Skip(SkipReason::JobNotRunning)),
        ("Failed Job pod is skipped", pod("a").job().phase("Failed"), None, Skip(SkipReason::JobNotRunning)),
        ("terminating Succeeded Job pod is skipped", pod("a").job().phase("Succeeded").terminating(), None, Skip(SkipReason::JobNotRunning)),
        ("running Job pod, protectedJobPods unset → protected", pod("a").job(), None, ProtectedJobPod),
        ("running Job pod, empty selector matches all → protected", pod("a").job(), Some(&empty), ProtectedJobPod),
        ("running Job pod matching protectedJobPods → protected", pod("a").job().label("batch", "critical"), Some(&critical), ProtectedJobPod),
        ("running Job pod not matching protectedJobPods → deleted", pod("a").job().label("batch", "nightly"), Some(&critical), DeleteJobPod),
        ("unlabelled running Job pod not matching → deleted", pod("a").job(), Some(&critical), DeleteJobPod),
        ("unusable selector (unknown operator) protects", pod("a").job(), Some(&unusable), ProtectedJobPod),
        ("unusable selector (In without values) protects", pod("a").job(), Some(&in_without_values), ProtectedJobPod),
        ("Job pod of unknown phase counts as running", pod("a").job().phase("Unknown"), None, ProtectedJobPod),
        ("Job pod without a phase counts as running", pod("a").job().phase(""), None, ProtectedJobPod),
        ("terminating running Job pod is already going: deleted, never a blocker", pod("a").job().terminating(), None, DeleteJobPod),
        ("terminating ReplicaSet pod is still waited for", pod("a").terminating(), None, Evict),
    ];
    for (name, p, selector, want) in cases {
        assert_eq!(classify_pod(&p, selector), want, "{name}");
    }
}

#[test]
fn drain_work_sorts_pods_and_counts_terminating_ones_without_evicting_them_again() {
    let critical = match_labels(&[("batch", "critical")]);
    let pods = vec![
        pod("ds").owner(Some("DaemonSet")),
        pod("static").mirror(),
        pod("job-done").job().phase("Succeeded"),
        pod("job-pending").job().phase("Pending"),
        pod("job-critical").job().label("batch", "critical"),
        pod("job-nightly").job().label("batch", "nightly"),
        pod("web"),
        pod("web-going").terminating(),
        pod("job-nightly-going")
            .job()
            .label("batch", "nightly")
            .terminating(),
        pod("job-critical-going")
            .job()
            .label("batch", "critical")
            .terminating(),
    ];
    let work = drain_work(&pods, Some(&critical));
    let keys = |v: &[PodView]| v.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&work.evict), vec!["web"]);
    assert_eq!(keys(&work.delete), vec!["job-nightly"]);
    assert_eq!(keys(&work.blockers), vec!["job-critical"]);
    assert_eq!(
        keys(&work.remaining),
        vec![
            "job-critical",
            "job-nightly",
            "web",
            "web-going",
            "job-nightly-going",
            "job-critical-going"
        ]
    );

    // Default (None): every running Job pod protects the node.
    let work = drain_work(&pods, None);
    assert_eq!(keys(&work.blockers), vec!["job-critical", "job-nightly"]);
    assert!(work.delete.is_empty());

    // Nothing but skipped pods: nothing to do, nothing to wait for.
    let work = drain_work(&pods[..4], None);
    assert_eq!(work, DrainWork::default());
}

#[test]
fn pod_view_reads_controller_mirror_and_deletion_from_the_pod() {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": "batch",
            "name": "nightly-x7k2p",
            "uid": "6f1c",
            "labels": { "job-name": "nightly" },
            "deletionTimestamp": "2025-06-15T14:00:00Z",
            "ownerReferences": [
                { "apiVersion": "v1", "kind": "ConfigMap", "name": "noise", "uid": "1" },
                { "apiVersion": "batch/v1", "kind": "Job", "name": "nightly", "uid": "2",
                  "controller": true, "blockOwnerDeletion": true }
            ]
        },
        "spec": { "containers": [ { "name": "c", "image": "busybox" } ] },
        "status": { "phase": "Running" }
    }))
    .unwrap();
    let v = PodView::from_pod(&p);
    assert_eq!(v.key(), "batch/nightly-x7k2p");
    assert_eq!(v.uid, "6f1c");
    assert_eq!(v.phase, "Running");
    assert_eq!(v.controller_kind.as_deref(), Some("Job"));
    assert!(v.terminating);
    assert!(!v.mirror);
    assert_eq!(v.labels, labels(&[("job-name", "nightly")]));

    let mirror: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "namespace": "kube-system",
            "name": "kube-apiserver-cp1",
            "annotations": { "kubernetes.io/config.mirror": "abc" },
            "ownerReferences": [
                { "apiVersion": "v1", "kind": "Node", "name": "cp1", "uid": "n" }
            ]
        }
    }))
    .unwrap();
    let v = PodView::from_pod(&mirror);
    assert!(v.mirror);
    assert_eq!(
        v.controller_kind, None,
        "an owner that is not the controller"
    );
    assert_eq!(v.phase, "", "no status");
    assert!(!v.terminating);
    assert_eq!(
        classify_pod(&v, None),
        PodDisposition::Skip(SkipReason::Mirror)
    );
}

#[test]
fn namespace_protected_unless_a_usable_selector_does_not_match() {
    let prod = match_labels(&[("tier", "prod")]);
    let unusable = expression("tier", "Gt", &["1"]);
    let empty = LabelSelector::default();
    let prod_ns = labels(&[("tier", "prod")]);
    let dev_ns = labels(&[("tier", "dev")]);
    let unlabelled = BTreeMap::new();
    #[rustfmt::skip]
    let cases: Vec<(&str, Option<&LabelSelector>, Option<&Labels>, bool)> = vec![
        ("unset selector protects every namespace", None, Some(&dev_ns), true),
        ("unset selector, unknown namespace", None, None, true),
        ("unknown namespace is protected", Some(&prod), None, true),
        ("matching namespace is protected", Some(&prod), Some(&prod_ns), true),
        ("other namespace is not protected", Some(&prod), Some(&dev_ns), false),
        ("unlabelled namespace is not protected", Some(&prod), Some(&unlabelled), false),
        ("empty selector protects everything", Some(&empty), Some(&dev_ns), true),
        ("unusable selector protects", Some(&unusable), Some(&dev_ns), true),
    ];
    for (name, selector, ns_labels, want) in cases {
        assert_eq!(namespace_protected(selector, ns_labels), want, "{name}");
    }
}

// ---------------------------------------------------------------------------------------
// Evictions.

/// (name, answer, namespace protected, attempt, config, the step or words of its `Fail`)
type EvictionCase<'a> = (
    &'a str,
    &'a EvictionAnswer,
    bool,
    u32,
    &'a QueueConfig,
    Result<EvictionStep, &'a [&'a str]>,
);

/// (name, answer, namespace protected, `Ok` or words of the `Err`)
type DryRunCase<'a> = (&'a str, &'a EvictionAnswer, bool, Result<(), &'a [&'a str]>);

fn eviction_config(retries: u32, interval_s: u64) -> QueueConfig {
    QueueConfig::from_spec(&RebootQueueSpec {
        evict_retries: Some(retries),
        evict_interval_seconds: Some(interval_s),
        ..Default::default()
    })
}

#[test]
fn after_eviction_follows_ckes_rules() {
    let p = pod("web");
    let refused = EvictionAnswer::Refused(
        "Cannot evict pod as it would violate the pod's disruption budget.".into(),
    );
    let failed = EvictionAnswer::Failed("500 Internal Server Error".into());
    let none = eviction_config(0, 0);
    let two = eviction_config(2, 7);
    #[rustfmt::skip]
    let cases: Vec<EvictionCase> = vec![
        ("evicted → done", &EvictionAnswer::Evicted, true, 1, &none, Ok(EvictionStep::Done)),
        ("404 → done (already gone)", &EvictionAnswer::NotFound, true, 1, &none, Ok(EvictionStep::Done)),
        ("404 unprotected → done", &EvictionAnswer::NotFound, false, 3, &two, Ok(EvictionStep::Done)),
        ("429 unprotected → delete", &refused, false, 1, &none, Ok(EvictionStep::Delete)),
        ("429 unprotected → delete, even with retries left", &refused, false, 1, &two, Ok(EvictionStep::Delete)),
        ("429 protected, no retries → fail at once", &refused, true, 1, &none,
            Err(&["app/web", "protected namespace app", "after 1 attempt:", "disruption budget"])),
        ("429 protected, attempt 1 of 2 retries → retry after the interval", &refused, true, 1, &two, Ok(EvictionStep::RetryAfter(secs(7)))),
        ("429 protected, attempt 2 of 2 retries → retry after the interval", &refused, true, 2, &two, Ok(EvictionStep::RetryAfter(secs(7)))),
        ("429 protected, attempt 3 = retries + 1 → fail", &refused, true, 3, &two,
            Err(&["app/web", "after 3 attempts:", "disruption budget"])),
        ("other error, protected → fail", &failed, true, 1, &two, Err(&["eviction of app/web failed: 500 Internal Server Error"])),
        ("other error, unprotected → fail (never a delete)", &failed, false, 1, &two, Err(&["failed: 500"])),
    ];
    for (name, answer, protected, attempt, config, want) in cases {
        let got = after_eviction(&p, answer, protected, attempt, config);
        match (want, got) {
            (Ok(w), g) => assert_eq!(g, w, "{name}"),
            (Err(words), EvictionStep::Fail(why)) => {
                for word in words {
                    assert!(why.contains(word), "{name}: {why:?} lacks {word:?}");
                }
            }
            (Err(_), g) => panic!("{name}: want Fail, got {g:?}"),
        }
    }
}

#[test]
fn a_protected_refusal_is_retried_evict_retries_times_then_fails() {
    let p = pod("db-0");
    let refused = EvictionAnswer::Refused("pdb".into());
    for retries in 0..5 {
        let config = eviction_config(retries, 3);
        for attempt in 1..=retries {
            assert_eq!(
                after_eviction(&p, &refused, true, attempt, &config),
                EvictionStep::RetryAfter(secs(3)),
                "retries {retries}, attempt {attempt}"
            );
        }
        assert!(
            matches!(
                after_eviction(&p, &refused, true, retries + 1, &config),
                EvictionStep::Fail(_)
            ),
            "retries {retries}: attempt {} must fail",
            retries + 1
        );
    }
    // No overflow at the very end of the range.
    let config = eviction_config(u32::MAX, 1);
    assert_eq!(
        after_eviction(&p, &refused, true, u32::MAX, &config),
        EvictionStep::RetryAfter(secs(1))
    );
}

#[test]
fn eviction_answers_have_metric_labels() {
    assert_eq!(EvictionAnswer::Evicted.result_label(), "evicted");
    assert_eq!(EvictionAnswer::NotFound.result_label(), "not_found");
    assert_eq!(
        EvictionAnswer::Refused(String::new()).result_label(),
        "refused"
    );
    assert_eq!(
        EvictionAnswer::Failed(String::new()).result_label(),
        "error"
    );
}

#[test]
fn after_dry_run_refuses_only_what_a_real_drain_could_not_do() {
    let p = pod("db-0");
    let refused = EvictionAnswer::Refused("budget".into());
    let failed = EvictionAnswer::Failed("timeout".into());
    #[rustfmt::skip]
    let cases: Vec<DryRunCase> = vec![
        ("would be evicted", &EvictionAnswer::Evicted, true, Ok(())),
        ("already gone", &EvictionAnswer::NotFound, true, Ok(())),
        ("refused but unprotected: would be deleted", &refused, false, Ok(())),
        ("refused in a protected namespace", &refused, true,
            Err(&["PodDisruptionBudget", "app/db-0", "protected namespace app", "budget"])),
        ("dry-run failed", &failed, false, Err(&["dry-run of app/db-0 failed: timeout"])),
    ];
    for (name, answer, protected, want) in cases {
        match (want, after_dry_run(&p, answer, protected)) {
            (Ok(()), Ok(())) => {}
            (Err(words), Err(why)) => {
                for word in words {
                    assert!(why.contains(word), "{name}: {why:?} lacks {word:?}");
                }
            }
            (want, got) => panic!("{name}: want {want:?}, got {got:?}"),
        }
    }
}

#[test]
fn job_pod_blockers_name_every_protected_job_pod() {
    assert_eq!(job_pod_blockers(&DrainWork::default()), Ok(()));
    let one = DrainWork {
        blockers: vec![pod("a").job()],
        ..Default::default()
    };
    assert_eq!(
        job_pod_blockers(&one).unwrap_err().to_string(),
        "running Job pod protected by protectedJobPods: app/a"
    );
    let two = DrainWork {
        blockers: vec![pod("a").job(), pod("b").job()],
        ..Default::default()
    };
    assert_eq!(
        job_pod_blockers(&two).unwrap_err().0,
        "running Job pods protected by protectedJobPods: app/a, app/b"
    );
    // Pods to evict or delete do not block.
    let other = DrainWork {
        evict: vec![pod("web")],
        delete: vec![pod("j").job()],
        remaining: vec![pod("web"), pod("j").job()],
        ..Default::default()
    };
    assert_eq!(job_pod_blockers(&other), Ok(()));
}

// ---------------------------------------------------------------------------------------
// Progress and timeout.

#[test]
fn drain_completes_with_no_pods_and_no_volumes_and_times_out_from_the_draining_time() {
    let timeout = secs(600);
    let now = ts(0);
    use DrainProgress::*;
    #[rustfmt::skip]
    let cases: Vec<(&str, usize, usize, Option<Timestamp>, DrainProgress)> = vec![
        ("nothing left → complete", 0, 0, Some(ts(-10)), Complete),
        ("nothing left after the timeout → still complete", 0, 0, Some(ts(-10_000)), Complete),
        ("nothing left, no recorded start → complete", 0, 0, None, Complete),
        ("a volume still in use holds it", 0, 1, Some(ts(-10)), Waiting { pods: 0, volumes_in_use: 1 }),
        ("a pod still there holds it", 1, 0, Some(ts(-10)), Waiting { pods: 1, volumes_in_use: 0 }),
        ("one second before the timeout → waiting", 2, 1, Some(ts(-599)), Waiting { pods: 2, volumes_in_use: 1 }),
        ("exactly at the timeout → timed out", 2, 1, Some(ts(-600)), TimedOut { pods: 2, volumes_in_use: 1 }),
        ("past the timeout → timed out", 0, 3, Some(ts(-601)), TimedOut { pods: 0, volumes_in_use: 3 }),
        ("no recorded Draining time never times out", 5, 0, None, Waiting { pods: 5, volumes_in_use: 0 }),
        ("a start in the future (clock skew) → waiting", 1, 0, Some(ts(3_600)), Waiting { pods: 1, volumes_in_use: 0 }),
    ];
    for (name, pods, volumes, since, want) in cases {
        assert_eq!(
            drain_progress(pods, volumes, since, now, timeout),
            want,
            "{name}"
        );
    }
    // The timeout counts from the recorded transition, not from whenever we look (a
    // restarted operator does not get a fresh ten minutes).
    let since = ts(-700);
    assert_eq!(
        drain_progress(1, 0, Some(since), ts(0), timeout),
        TimedOut {
            pods: 1,
            volumes_in_use: 0
        }
    );
    assert_eq!(drain_deadline(since, timeout), ts(-100));
}

// ---------------------------------------------------------------------------------------
// Backoff.

fn backoff(base: u64, max: u64, jitter: u64) -> BackoffConfig {
    BackoffConfig {
        base: secs(base),
        max: secs(max),
        jitter: secs(jitter),
    }
}

#[test]
fn backoff_doubles_from_base_up_to_max_plus_jitter_below_the_jitter() {
    let c = backoff(300, 1200, 300);
    let no_jitter = backoff(300, 1200, 0);
    let base_above_max = backoff(5000, 1200, 0);
    let zero_base = backoff(0, 1200, 100);
    let just_under = secs(300) - Duration::from_nanos(1);
    #[rustfmt::skip]
    let cases: Vec<(&str, u32, &BackoffConfig, f64, Duration)> = vec![
        ("1st failure → base", 1, &c, 0.0, secs(300)),
        ("2nd failure → 2 × base", 2, &c, 0.0, secs(600)),
        ("3rd failure → 4 × base = max", 3, &c, 0.0, secs(1200)),
        ("4th failure → capped at max", 4, &c, 0.0, secs(1200)),
        ("0 failures reads as the first", 0, &c, 0.0, secs(300)),
        ("31st failure → max", 31, &c, 0.0, secs(1200)),
        ("32nd failure (2^31 × base) → max", 32, &c, 0.0, secs(1200)),
        ("33rd failure (shift past 32 bits) → max", 33, &c, 0.0, secs(1200)),
        ("u32::MAX failures → max, no overflow", u32::MAX, &c, 0.0, secs(1200)),
        ("half the jitter", 1, &c, 0.5, secs(450)),
        ("jitter fraction just below 1 stays below the jitter", 2, &c, 0.999_999_999_999, secs(600) + just_under),
        ("jitter fraction 1 is clamped below the jitter", 2, &c, 1.0, secs(600) + just_under),
        ("jitter fraction above 1 is clamped below the jitter", 4, &c, 7.0, secs(1200) + just_under),
        ("negative jitter fraction → no jitter", 1, &c, -0.5, secs(300)),
        ("NaN jitter fraction → no jitter", 1, &c, f64::NAN, secs(300)),
        ("+∞ jitter fraction → no jitter", 1, &c, f64::INFINITY, secs(300)),
        ("-∞ jitter fraction → no jitter", 1, &c, f64::NEG_INFINITY, secs(300)),
        ("zero jitter adds nothing", 2, &no_jitter, 0.9, secs(600)),
        ("base above max → max", 1, &base_above_max, 0.0, secs(1200)),
        ("zero base → only jitter", 3, &zero_base, 0.25, secs(25)),
    ];
    for (name, failures, config, fraction, want) in cases {
        assert_eq!(backoff_delay(failures, config, fraction), want, "{name}");
    }
}

#[test]
fn backoff_never_panics_on_huge_durations() {
    let huge = BackoffConfig {
        base: Duration::MAX,
        max: Duration::MAX,
        jitter: Duration::MAX,
    };
    for failures in [0, 1, 2, 31, 32, 33, u32::MAX] {
        for fraction in [0.0, 0.5, 0.999_999, 1.0, 2.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(
                backoff_delay(failures, &huge, fraction),
                Duration::MAX,
                "failures {failures}, fraction {fraction}"
            );
        }
    }
    let jitter_only = BackoffConfig {
        base: Duration::ZERO,
        max: Duration::ZERO,
        jitter: Duration::MAX,
    };
    for fraction in [0.5, 0.999_999, 1.0, 2.0] {
        let d = backoff_delay(1, &jitter_only, fraction);
        assert!(
            d < Duration::MAX,
            "fraction {fraction}: jitter stays below the jitter"
        );
    }
    // The spec path caps every setting, so the largest configurable backoff works too.
    let from_spec = QueueConfig::from_spec(&RebootQueueSpec {
        drain_backoff: Some(hostcycle_api::queue::DrainBackoffSpec {
            base_seconds: Some(u64::MAX),
            max_seconds: Some(u64::MAX),
            jitter_seconds: Some(u64::MAX),
        }),
        ..Default::default()
    });
    let (failures, until) = next_backoff(u32::MAX, &from_spec.backoff, ts(0), 0.999);
    assert_eq!(failures, u32::MAX);
    assert!(until > ts(0));
}

#[test]
fn next_backoff_counts_the_failure_and_sets_the_expiry() {
    let c = backoff(300, 1200, 300);
    assert_eq!(next_backoff(0, &c, ts(0), 0.0), (1, ts(300)));
    assert_eq!(next_backoff(1, &c, ts(0), 0.0), (2, ts(600)));
    assert_eq!(next_backoff(2, &c, ts(0), 0.5), (3, ts(1350)));
    assert_eq!(next_backoff(9, &c, ts(100), 0.0), (10, ts(1300)));
    // The count saturates, the expiry saturates.
    assert_eq!(
        next_backoff(u32::MAX, &c, ts(0), f64::NAN),
        (u32::MAX, ts(1200))
    );
    assert_eq!(
        next_backoff(3, &c, Timestamp::MAX, 0.0),
        (4, Timestamp::MAX)
    );
}

#[test]
fn add_and_elapsed_saturate() {
    #[rustfmt::skip]
    let adds: Vec<(&str, Timestamp, Duration, Timestamp)> = vec![
        ("plain", ts(0), secs(90), ts(90)),
        ("zero", ts(0), Duration::ZERO, ts(0)),
        ("past jiff's maximum → maximum", Timestamp::MAX, secs(1), Timestamp::MAX),
        ("Duration::MAX (beyond SignedDuration) → maximum", ts(0), Duration::MAX, Timestamp::MAX),
        ("far but representable", Timestamp::MIN, secs(1), Timestamp::MIN.checked_add(jiff::SignedDuration::from_secs(1)).unwrap()),
    ];
    for (name, t, d, want) in adds {
        assert_eq!(add(t, d), want, "{name}");
    }
    #[rustfmt::skip]
    let elapsed_cases: Vec<(&str, Timestamp, Timestamp, Duration)> = vec![
        ("since before now", ts(-90), ts(0), secs(90)),
        ("same instant", ts(0), ts(0), Duration::ZERO),
        ("since in the future → zero", ts(90), ts(0), Duration::ZERO),
        ("the whole range", Timestamp::MIN, Timestamp::MAX,
            Duration::try_from(Timestamp::MAX.duration_since(Timestamp::MIN)).unwrap()),
        ("the whole range backwards → zero", Timestamp::MAX, Timestamp::MIN, Duration::ZERO),
    ];
    for (name, since, now, want) in elapsed_cases {
        assert_eq!(elapsed(since, now), want, "{name}");
    }
}
