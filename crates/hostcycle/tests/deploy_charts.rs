//! The Helm chart (deploy/helm/hostcycle) and the kustomize bases (deploy/kustomize,
//! deploy/monitoring), rendered by the real tools: Helm 3 and Helm 4, and kustomize as
//! kubectl 1.33 and Debian's kubectl 1.20 carry it. With default values the chart is exactly deploy/crds.yaml and
//! deploy/operator.yaml; each option `hostcycle manifests --deploy` also has renders what that
//! command renders; the monitoring objects are the same from Helm and from kustomize.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod install_tools;

use std::path::{Path, PathBuf};

use install_tools::*;
use serde_json::Value;

const REGENERATE: &str = "make deploy-manifests";

fn deploy_objects() -> Vec<Value> {
    objects_of_files(&[
        deploy_dir().join("crds.yaml"),
        deploy_dir().join("operator.yaml"),
    ])
}

fn helm_template(helm: &Path, args: &[&str]) -> Vec<Value> {
    let chart = chart_dir();
    let mut all = vec!["template", "hostcycle", chart.to_str().unwrap()];
    all.extend(args);
    objects(&run(helm, &all))
}

fn manifests(args: &[&str]) -> Vec<Value> {
    let mut all = vec!["manifests", "--deploy"];
    all.extend(args);
    objects(&run(Path::new(env!("CARGO_BIN_EXE_hostcycle")), &all))
}

fn kustomize(kubectl: &Path, dir: &Path) -> Vec<Value> {
    objects(&run(kubectl, &["kustomize", dir.to_str().unwrap()]))
}

/// Neither Helm nor kustomize reads a file outside its directory: the chart and the base
/// carry copies, which `make deploy-manifests` refreshes.
#[test]
fn the_copies_in_the_chart_and_the_kustomize_base_are_current() {
    let deploy = deploy_dir();
    let pairs: [(PathBuf, PathBuf); 5] = [
        (deploy.join("crds.yaml"), deploy.join("kustomize/crds.yaml")),
        (
            deploy.join("operator.yaml"),
            deploy.join("kustomize/operator.yaml"),
        ),
        (deploy.join("crds.yaml"), chart_dir().join("crds/crds.yaml")),
        (
            deploy.join("monitoring/prometheus-rule.yaml"),
            chart_dir().join("files/prometheus-rule.yaml"),
        ),
        (
            deploy.join("monitoring/grafana-dashboard.json"),
            chart_dir().join("files/grafana-dashboard.json"),
        ),
    ];
    for (original, copy) in pairs {
        assert!(
            read(&original) == read(&copy),
            "{} is not a copy of {}; run {REGENERATE}",
            copy.display(),
            original.display()
        );
    }
}

#[test]
fn the_chart_with_default_values_renders_deploy_exactly() {
    let deploy = deploy_objects();
    for (name, helm) in helms() {
        run(&helm, &["lint", "--strict", chart_dir().to_str().unwrap()]);
        let rendered = helm_template(&helm, &["--include-crds"]);
        assert_same_objects(&rendered, name, &deploy, "deploy/crds.yaml + operator.yaml");
    }
    // Chart.yaml's appVersion is the default image tag: the crate's version.
    let chart: Value = serde_saphyr::from_str(&read(&chart_dir().join("Chart.yaml"))).unwrap();
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"));
    assert_eq!(chart["version"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn the_kustomize_base_renders_deploy_exactly() {
    for (name, kubectl) in kubectls() {
        let rendered = kustomize(&kubectl, &deploy_dir().join("kustomize"));
        assert_same_objects(
            &rendered,
            &format!("{name} deploy/kustomize"),
            &deploy_objects(),
            "deploy/crds.yaml + operator.yaml",
        );
    }
}

/// Every option the generator has, in every combination of controllers, cluster-wide and
/// namespaced: the chart's RBAC, args and namespaces are the generator's.
#[test]
fn chart_options_render_what_hostcycle_manifests_renders() {
    let subsets: [&[&str]; 8] = [
        &["baremetalhost", "reboot-queue", "remediation"],
        &["health-check"],
        &["baremetalhost"],
        &["reboot-queue"],
        &["remediation"],
        &["baremetalhost", "reboot-queue"],
        &["baremetalhost", "remediation"],
        &["reboot-queue", "remediation"],
    ];
    let mut cases: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    for controllers in subsets {
        let list = controllers.join(",");
        for namespaced in [false, true] {
            let (mut set, mut flags) = (
                vec![format!("controllers={{{list}}}")],
                vec![format!("--controllers={list}")],
            );
            if namespaced {
                set.push("watchNamespace=tenant-a".into());
                flags.push("--namespace=tenant-a".into());
            }
            cases.push((set, flags));
        }
    }
    // The operator's namespace, the image, the Lease and the metrics scrapers' label.
    cases.push((
        vec![
            "namespace.name=ops".into(),
            "image.repository=registry.example/hostcycle".into(),
            "image.tag=1.2.3".into(),
            "leaseName=other-lease".into(),
            "metricsScraperLabel=example.com/scrapers=platform".into(),
        ],
        vec![
            "--operator-namespace=ops".into(),
            "--image=registry.example/hostcycle:1.2.3".into(),
            "--lease-name=other-lease".into(),
            "--metrics-scraper-label=example.com/scrapers=platform".into(),
        ],
    ));
    // The security flags (docs/security.md).
    cases.push((
        vec![
            "bmcNetworks={10.0.0.0/24,.bmc.example}".into(),
            "allowPlainHttpBmc=true".into(),
            "refuseUnverifiedBmcTls=true".into(),
            "bmcCredentialsLabel=hostcycle.io/bmc-credentials=true".into(),
            "remediationRequestNamespaces=same-as-host\\,remediators".into(),
        ],
        vec![
            "--bmc-networks=10.0.0.0/24,.bmc.example".into(),
            "--allow-plain-http-bmc".into(),
            "--refuse-unverified-bmc-tls".into(),
            "--bmc-credentials-label=hostcycle.io/bmc-credentials=true".into(),
            "--remediation-request-namespaces=same-as-host,remediators".into(),
        ],
    ));
    // A namespaced install with the operator in a namespace of another name.
    cases.push((
        vec![
            "namespace.name=ops".into(),
            "watchNamespace=tenant-b".into(),
        ],
        vec![
            "--operator-namespace=ops".into(),
            "--namespace=tenant-b".into(),
        ],
    ));
    // Helm 3 renders every case; Helm 4 (the same template engine, a newer Helm) every third
    // and the last.
    let helms = helms();
    let jobs: Vec<_> = cases.iter().enumerate().collect();
    // Two workers: the machine's cores.
    std::thread::scope(|scope| {
        for half in jobs.chunks(jobs.len().div_ceil(2)) {
            let (helms, cases) = (&helms, &cases);
            scope.spawn(move || {
                for (i, (set, flags)) in half {
                    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
                    let expected = manifests(&flags);
                    let helms_here = if i % 3 == 0 || i + 1 == cases.len() {
                        &helms[..]
                    } else {
                        &helms[..1]
                    };
                    for (name, helm) in helms_here {
                        let mut args = vec!["--include-crds"];
                        for s in set {
                            args.extend(["--set", s.as_str()]);
                        }
                        let rendered = helm_template(helm, &args);
                        assert_same_objects(
                            &rendered,
                            &format!("{name} --set {}", set.join(" --set ")),
                            &expected,
                            &format!("hostcycle manifests --deploy {}", flags.join(" ")),
                        );
                    }
                }
            });
        }
    });
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {objects:?}"))
}

/// Values the generator does not have: they land where they should and nowhere else.
#[test]
fn chart_values_beyond_the_generator() {
    let sets = [
        "replicas=3",
        "resources.limits.memory=1Gi",
        "extraArgs={--action-concurrency=32,--steady-poll=2m}",
        "extraEnv[0].name=HOSTCYCLE_LOG_FORMAT",
        "extraEnv[0].value=json",
        "nodeSelector.node-role\\.kubernetes\\.io/control-plane=",
        "tolerations[0].key=node-role.kubernetes.io/control-plane",
        "tolerations[0].operator=Exists",
        "tolerations[0].effect=NoSchedule",
        "podAnnotations.example\\.org/owner=platform",
        "podLabels.team=platform",
        "priorityClassName=system-cluster-critical",
        "imagePullSecrets[0].name=registry-login",
        "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "commonLabels.example\\.org/stack=metal",
    ];
    for (name, helm) in helms() {
        let mut args = Vec::new();
        for s in sets {
            args.extend(["--set", s]);
        }
        let objects = helm_template(&helm, &args);
        for object in &objects {
            assert_eq!(
                object["metadata"]["labels"]["example.org/stack"],
                "metal",
                "{name}: commonLabels on {}",
                key(object)
            );
        }
        let deployment = find(&objects, "Deployment");
        let spec = &deployment["spec"];
        assert_eq!(spec["replicas"], 3, "{name}");
        assert_eq!(
            spec["selector"]["matchLabels"],
            serde_json::json!({ "app.kubernetes.io/name": "hostcycle-operator" }),
            "{name}: selectors never change"
        );
        let pod = &spec["template"];
        assert_eq!(pod["metadata"]["labels"]["team"], "platform", "{name}");
        assert_eq!(
            pod["metadata"]["annotations"]["example.org/owner"], "platform",
            "{name}"
        );
        let pod_spec = &pod["spec"];
        assert_eq!(
            pod_spec["priorityClassName"], "system-cluster-critical",
            "{name}"
        );
        assert_eq!(
            pod_spec["imagePullSecrets"][0]["name"], "registry-login",
            "{name}"
        );
        assert_eq!(
            pod_spec["nodeSelector"]["node-role.kubernetes.io/control-plane"], "",
            "{name}"
        );
        assert_eq!(pod_spec["tolerations"][0]["operator"], "Exists", "{name}");
        let container = &pod_spec["containers"][0];
        assert_eq!(
            container["image"],
            "ghcr.io/hostcycle/hostcycle@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "{name}"
        );
        let args: Vec<&str> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(
            &args[args.len() - 2..],
            ["--action-concurrency=32", "--steady-poll=2m"],
            "{name}"
        );
        assert_eq!(container["resources"]["limits"]["memory"], "1Gi", "{name}");
        assert_eq!(container["resources"]["limits"]["cpu"], "1", "{name}");
        assert_eq!(
            container["env"][2]["name"], "HOSTCYCLE_LOG_FORMAT",
            "{name}"
        );

        // The namespace exists already, or is the release's.
        let objects = helm_template(
            &helm,
            &[
                "--namespace",
                "platform",
                "--set",
                "namespace.create=false",
                "--set",
                "namespace.name=",
            ],
        );
        assert!(
            !objects.iter().any(|o| o["kind"] == "Namespace"),
            "{name}: no Namespace with namespace.create=false"
        );
        assert_eq!(
            find(&objects, "Deployment")["metadata"]["namespace"],
            "platform",
            "{name}"
        );
        assert_eq!(
            find(&objects, "ClusterRoleBinding")["subjects"][0]["namespace"],
            "platform",
            "{name}"
        );
    }
}

/// The values schema refuses what would render a broken install.
#[test]
fn the_chart_refuses_bad_values() {
    for (name, helm) in helms() {
        for bad in [
            "replicas=two",
            "controllers={reboot-queue,fencing}",
            "image.pullPolicy=Sometimes",
            "replica=2",
            "namespace.name=Not_A_Namespace",
            "watchNamespace=Not_A_Namespace",
            "metricsScraperLabel=",
            "metricsScraperLabel=monitoring",
            "metricsScraperLabel=Not A Label=true",
            // The hosts' namespace is never the operator's (its ServiceAccount would be there).
            "watchNamespace=hostcycle-system",
            // BMC networks need a choice of credentials Secrets (a label, or `none`).
            "bmcNetworks={10.0.0.0/24}",
        ] {
            let chart = chart_dir();
            let output = run_raw(
                &helm,
                &[
                    "template",
                    "hostcycle",
                    chart.to_str().unwrap(),
                    "--set",
                    bad,
                ],
            );
            assert!(
                !output.status.success(),
                "{name} accepted --set {bad}:\n{}",
                String::from_utf8_lossy(&output.stdout)
            );
        }
    }
}

/// deploy/monitoring through kustomize and the chart's `monitoring.enabled=true`: the same
/// ServiceMonitor, PrometheusRule and dashboard ConfigMap; the ServiceMonitor finds the
/// metrics Service of deploy/operator.yaml.
#[test]
fn monitoring_is_the_same_from_kustomize_and_helm_and_scrapes_the_operator() {
    let [(_, kubectl), (old_name, old_kubectl)] = kubectls();
    let from_kustomize = kustomize(&kubectl, &deploy_dir().join("monitoring"));
    assert_same_objects(
        &kustomize(&old_kubectl, &deploy_dir().join("monitoring")),
        &format!("{old_name} deploy/monitoring"),
        &from_kustomize,
        "kubectl kustomize deploy/monitoring",
    );
    let default = helm_template(&helms()[0].1, &[]);
    for (name, helm) in helms() {
        let all = helm_template(&helm, &["--set", "monitoring.enabled=true"]);
        let added: Vec<Value> = all
            .iter()
            .filter(|o| !default.iter().any(|d| key(d) == key(o)))
            .cloned()
            .collect();
        assert_same_objects(
            &added,
            &format!("{name} monitoring.enabled=true"),
            &from_kustomize,
            "kubectl kustomize deploy/monitoring",
        );
    }
    let rule_file = objects(&read(&deploy_dir().join("monitoring/prometheus-rule.yaml")));
    assert_eq!(
        find(&from_kustomize, "PrometheusRule"),
        &rule_file[0],
        "the PrometheusRule is the file as it is"
    );
    let dashboard = find(&from_kustomize, "ConfigMap");
    assert_eq!(
        dashboard["data"]["hostcycle.json"].as_str().unwrap(),
        read(&deploy_dir().join("monitoring/grafana-dashboard.json"))
    );
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");

    let operator = objects(&read(&deploy_dir().join("operator.yaml")));
    let service = find(&operator, "Service");
    let monitor = find(&from_kustomize, "ServiceMonitor");
    for (label, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &service["metadata"]["labels"][label], value,
            "the Service carries the ServiceMonitor's label {label}"
        );
    }
    assert_eq!(
        monitor["spec"]["namespaceSelector"]["matchNames"][0],
        service["metadata"]["namespace"]
    );
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
}
