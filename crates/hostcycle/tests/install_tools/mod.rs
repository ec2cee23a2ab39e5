//! The real install tools the deploy/ tests run (scripts/install-tools.sh puts them in
//! `$HOSTCYCLE_CACHE/tools`), and comparing the objects they render.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

pub const INSTALL_HINT: &str = "install it with scripts/install-prereqs.sh (make prereqs)";

/// A tool: `$env` when set, else its place under `$HOSTCYCLE_CACHE/tools`.
fn tool(env: &str, relative: &str) -> PathBuf {
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| hostcycle_testkit::cache_dir().join("tools").join(relative));
    assert!(
        path.is_file(),
        "{} is missing ({env} overrides the path); {INSTALL_HINT}",
        path.display()
    );
    path
}

/// Helm 3 and Helm 4, the official binaries.
pub fn helms() -> [(&'static str, PathBuf); 2] {
    [
        ("helm 3", tool("HOSTCYCLE_HELM3", "helm-v3.17.2/helm")),
        ("helm 4", tool("HOSTCYCLE_HELM4", "helm-v4.1.4/helm")),
    ]
}

/// kubectl, for its built-in kustomize (`kubectl kustomize`): a current one (kustomize
/// v5.6.0), and Debian bookworm's 1.20 (kustomize v2.0.3), the oldest the bases support.
pub fn kubectls() -> [(&'static str, PathBuf); 2] {
    [
        (
            "kubectl 1.33 kustomize",
            tool("HOSTCYCLE_KUBECTL", "kubectl-v1.33.9/kubectl"),
        ),
        (
            "kubectl 1.20 (Debian) kustomize",
            tool("HOSTCYCLE_KUBECTL_OLD", "kubectl-debian/kubectl"),
        ),
    ]
}

/// Prometheus' promtool.
pub fn promtool() -> PathBuf {
    tool("HOSTCYCLE_PROMTOOL", "promtool/promtool")
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn deploy_dir() -> PathBuf {
    repo_root().join("deploy")
}

pub fn chart_dir() -> PathBuf {
    deploy_dir().join("helm/hostcycle")
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Runs `program args…` with a scratch HOME (Helm writes its cache and config there) and
/// returns its standard output; panics with its standard error when it fails.
pub fn run(program: &Path, args: &[&str]) -> String {
    let output = run_raw(program, args);
    assert!(
        output.status.success(),
        "{} {} failed ({}):\n{}",
        program.display(),
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

pub fn run_raw(program: &Path, args: &[&str]) -> std::process::Output {
    let scratch = tempfile::tempdir().unwrap();
    let home = scratch.path();
    Command::new(program)
        .args(args)
        .env("HOME", home)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()))
}

/// The objects of a YAML stream (empty documents left out).
pub fn objects(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .unwrap_or_else(|e| panic!("not a YAML stream: {e}\n{yaml}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

pub fn objects_of_files(files: &[PathBuf]) -> Vec<Value> {
    files.iter().flat_map(|f| objects(&read(f))).collect()
}

/// `kind namespace/name` of an object, with its apiVersion: unique in an install.
pub fn key(object: &Value) -> String {
    let meta = &object["metadata"];
    format!(
        "{} {} {}/{}",
        object["apiVersion"].as_str().unwrap_or("?"),
        object["kind"].as_str().unwrap_or("?"),
        meta["namespace"].as_str().unwrap_or(""),
        meta["name"].as_str().unwrap_or("?"),
    )
}

fn by_key(objects: &[Value], what: &str) -> BTreeMap<String, Value> {
    let mut map = BTreeMap::new();
    for object in objects {
        let previous = map.insert(key(object), object.clone());
        assert!(previous.is_none(), "{what} has {} twice", key(object));
    }
    map
}

/// The first place where two values differ, as a path.
pub fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for k in a.keys().chain(b.keys()) {
                let here = format!("{path}.{k}");
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => {
                        if let Some(d) = first_difference(x, y, &here) {
                            return Some(d);
                        }
                    }
                    (x, y) => return Some(format!("{here}: {x:?} vs {y:?}")),
                }
            }
            None
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, &format!("{path}[{i}]"))),
        // kustomize writes CRD schemas' `minimum: 0.0` back as `0`: the same number.
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        _ if a == b => None,
        _ => Some(format!("{path}: {a} vs {b}")),
    }
}

/// The two lists hold the same objects (order aside), each equal field by field.
pub fn assert_same_objects(left: &[Value], left_what: &str, right: &[Value], right_what: &str) {
    let l = by_key(left, left_what);
    let r = by_key(right, right_what);
    let only_left: Vec<&String> = l.keys().filter(|k| !r.contains_key(*k)).collect();
    let only_right: Vec<&String> = r.keys().filter(|k| !l.contains_key(*k)).collect();
    assert!(
        only_left.is_empty() && only_right.is_empty(),
        "only in {left_what}: {only_left:?}; only in {right_what}: {only_right:?}"
    );
    for (k, a) in &l {
        if let Some(d) = first_difference(a, &r[k], "") {
            panic!("{k} differs between {left_what} and {right_what}: {d}");
        }
    }
}
