//! deploy/Dockerfile's runtime image, checked without Docker (no registry is reachable here):
//! every base image is pinned by digest; the runtime stage installs what the operator runs
//! (ipmitool for IPMI hosts, the OpenSSH client for reboot commands, CA certificates) and runs
//! as 65532, the Deployment's user; and the tool set is reproduced on this Debian bookworm
//! machine — the runtime stage's packages, nothing else on `PATH` — and drives the pyghmi IPMI
//! BMC through `hostcycle bmc`, the shared libraries coming from those packages' dependencies.
//! Needs scripts/install-prereqs.sh (the packages and the venv); fails, never skips, without.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hostcycle_testkit::bmc_emulators::{FakeIpmiBmc, FakePower};

const INSTALL_HINT: &str = "install it with scripts/install-prereqs.sh (make prereqs)";
const USER: &str = "admin";
const PASSWORD: &str = "image-tools-pw";

// ----- the Dockerfile ---------------------------------------------------------------------

fn dockerfile() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/Dockerfile");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// One `FROM` and the instructions after it, each with its continuation lines joined and
/// comments left out.
#[derive(Debug)]
struct Stage {
    from: String,
    instructions: Vec<String>,
}

impl Stage {
    /// The instructions of one keyword (`RUN`, `USER`, …), without the keyword.
    fn all(&self, keyword: &str) -> Vec<&str> {
        self.instructions
            .iter()
            .filter_map(|i| {
                let (word, rest) = i.split_once(char::is_whitespace)?;
                word.eq_ignore_ascii_case(keyword).then_some(rest.trim())
            })
            .collect()
    }

    /// The image of `FROM image [AS name]`.
    fn image(&self) -> &str {
        self.from.split_whitespace().next().unwrap_or("")
    }
}

fn stages(text: &str) -> Vec<Stage> {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                if !current.trim().is_empty() {
                    instructions.push(std::mem::take(&mut current));
                }
                current.clear();
            }
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for instruction in instructions {
        let (word, rest) = instruction
            .split_once(char::is_whitespace)
            .unwrap_or((instruction.as_str(), ""));
        if word.eq_ignore_ascii_case("FROM") {
            stages.push(Stage {
                from: rest.trim().to_string(),
                instructions: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push(instruction);
        } else {
            assert!(
                word.eq_ignore_ascii_case("ARG"),
                "{instruction} before the first FROM"
            );
        }
    }
    stages
}

fn runtime_stage(text: &str) -> Stage {
    stages(text).pop().expect("the Dockerfile has a FROM")
}

/// The packages of the runtime stage's `apt-get install` (options left out).
fn apt_packages(stage: &Stage) -> Vec<String> {
    let mut packages = Vec::new();
    for run in stage.all("RUN") {
        for command in run.split("&&").flat_map(|c| c.split(';')) {
            let words: Vec<&str> = command.split_whitespace().collect();
            if let Some(at) = words
                .windows(2)
                .position(|w| w[0] == "apt-get" && w[1] == "install")
            {
                packages.extend(
                    words[at + 2..]
                        .iter()
                        .filter(|w| !w.starts_with('-'))
                        .map(|w| w.to_string()),
                );
            }
        }
    }
    packages
}

fn is_sha256_digest(digest: &str) -> bool {
    digest.len() == 64
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A rebuild starts from the same bytes: `name:tag@sha256:<64 hex>` on every `FROM`, no
/// build argument that could swap the image.
#[test]
fn every_base_image_is_pinned_by_digest() {
    let text = dockerfile();
    let all = stages(&text);
    assert_eq!(all.len(), 2, "a build stage and the runtime stage");
    for stage in &all {
        let image = stage.image();
        assert!(!image.contains('$'), "FROM {image}: no build argument");
        let (name, digest) = image
            .split_once("@sha256:")
            .unwrap_or_else(|| panic!("FROM {image} is not pinned by digest (@sha256:…)"));
        assert!(
            is_sha256_digest(digest),
            "FROM {image}: the digest is 64 lower-case hex digits"
        );
        let tag = name.rsplit_once(':').map(|(_, tag)| tag).unwrap_or("");
        assert!(
            !tag.is_empty() && !tag.contains('/'),
            "FROM {image}: keep the tag before the digest, for people"
        );
    }
    // The checker itself.
    assert!(is_sha256_digest(&"0a".repeat(32)));
    assert!(!is_sha256_digest(&"0A".repeat(32)));
    assert!(!is_sha256_digest(&"0a".repeat(31)));
}

/// The image does what the docs promise: IPMI hosts (ipmitool), command reboots (ssh), TLS
/// BMCs verified against the system store (CA certificates), as the Deployment's user.
#[test]
fn the_runtime_stage_installs_what_the_operator_runs_and_runs_as_65532() {
    let text = dockerfile();
    let all = stages(&text);
    let build = &all[0];
    let runtime = runtime_stage(&text);
    // The same Debian release on both sides: the binary links bookworm's glibc.
    assert!(build.image().contains("-bookworm@"), "{}", build.image());
    assert!(
        runtime.image().contains("debian:bookworm-slim@"),
        "{}",
        runtime.image()
    );
    let packages = apt_packages(&runtime);
    for needed in ["ipmitool", "openssh-client", "ca-certificates"] {
        assert!(
            packages.iter().any(|p| p == needed),
            "the runtime stage installs {needed}: {packages:?}"
        );
    }
    let runs = runtime.all("RUN").join(" && ");
    assert!(runs.contains("--no-install-recommends"), "{runs}");
    assert!(runs.contains("rm -rf /var/lib/apt/lists"), "{runs}");
    // ssh needs a passwd entry for its uid.
    assert!(
        runs.contains("useradd --uid 65532 --gid 65532"),
        "the runtime stage creates user 65532: {runs}"
    );
    let uid = hostcycle_operator::deploy::RUN_AS_USER;
    assert_eq!(uid, 65532);
    assert_eq!(runtime.all("USER"), [format!("{uid}:{uid}")]);
    // The entrypoint is the binary the build stage made.
    let copy = runtime.all("COPY").join("\n");
    let entrypoint = runtime.all("ENTRYPOINT").join("");
    let target = copy
        .split_whitespace()
        .last()
        .expect("COPY --from=build … <target>");
    assert!(copy.contains("--from=build /out/hostcycle"), "{copy}");
    assert_eq!(entrypoint, format!("[\"{target}\"]"));
    assert_eq!(runtime.all("CMD"), ["[\"operator\"]"]);
}

/// The shell commands of a stage's `RUN`s, in order (split at `&&` and `;`), each as words.
fn run_commands(stage: &Stage) -> Vec<Vec<String>> {
    stage
        .all("RUN")
        .iter()
        .flat_map(|run| run.split("&&").flat_map(|c| c.split(';')))
        .map(|c| c.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter(|words| !words.is_empty())
        .collect()
}

/// Where the first command running `apt-get [options] <verb>` is, if any.
fn apt_get_position(commands: &[Vec<String>], verb: &str) -> Option<usize> {
    commands
        .iter()
        .position(|words| words.iter().any(|w| w == "apt-get") && words.iter().any(|w| w == verb))
}

/// The pinned base grows old; the build applies Debian's updates to it: `apt-get update`,
/// then a non-interactive `apt-get -y upgrade`, before the packages are installed (without
/// recommends); then apt's lists and downloads are removed. The stage refuses a base that is
/// not Debian bookworm.
#[test]
fn the_runtime_stage_applies_debians_updates_before_it_installs() {
    let text = dockerfile();
    let runtime = runtime_stage(&text);
    let commands = run_commands(&runtime);
    let at = |verb: &str| {
        apt_get_position(&commands, verb)
            .unwrap_or_else(|| panic!("the runtime stage runs apt-get {verb}: {commands:?}"))
    };
    let (update, upgrade, install) = (at("update"), at("upgrade"), at("install"));
    assert!(
        update < upgrade && upgrade < install,
        "update, then upgrade, then install: {commands:?}"
    );
    let upgrade_words = &commands[upgrade];
    assert!(
        upgrade_words.iter().any(|w| w == "-y"),
        "the upgrade is non-interactive: {upgrade_words:?}"
    );
    assert!(
        commands[install]
            .iter()
            .any(|w| w == "--no-install-recommends"),
        "{:?}",
        commands[install]
    );
    let clean = commands
        .iter()
        .position(|w| w.join(" ").starts_with("rm -rf /var/lib/apt/lists"))
        .expect("the package lists are removed");
    assert!(clean > install, "{commands:?}");
    let runs = runtime.all("RUN").join(" && ");
    assert!(runs.contains("/etc/os-release"), "{runs}");
    assert!(runs.contains(r#""$VERSION_CODENAME" = bookworm"#), "{runs}");

    // The checker itself: a stage that installs first, or never upgrades, fails it.
    let stale = runtime_stage(
        "FROM c:d@sha256:11\nRUN apt-get update && apt-get install -y x && apt-get -y upgrade\n",
    );
    let stale = run_commands(&stale);
    assert!(apt_get_position(&stale, "install") < apt_get_position(&stale, "upgrade"));
    let never = run_commands(&runtime_stage(
        "FROM c:d@sha256:11\nRUN apt-get update && apt-get install -y x\n",
    ));
    assert_eq!(apt_get_position(&never, "upgrade"), None);
}

#[test]
fn the_dockerfile_parser_reads_continuations_and_options() {
    let stage = runtime_stage(
        "ARG X=1\nFROM a:b@sha256:00 AS build\nRUN true\nFROM c:d@sha256:11\n# c\nRUN apt-get update \\\n && apt-get install -y --no-install-recommends one \\\n      two && rm -rf x\nUSER 1:1\n",
    );
    assert_eq!(stage.image(), "c:d@sha256:11");
    assert_eq!(apt_packages(&stage), ["one", "two"]);
    assert_eq!(stage.all("USER"), ["1:1"]);
}

// ----- the runtime's tool set on this machine ----------------------------------------------

fn dpkg_query(args: &[&str]) -> std::process::Output {
    Command::new("dpkg-query")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running dpkg-query (a Debian machine is needed): {e}"))
}

fn installed(package: &str) -> bool {
    let out = dpkg_query(&["-W", "-f=${Status}", package]);
    out.status.success() && String::from_utf8_lossy(&out.stdout) == "install ok installed"
}

/// The files a package installed (`dpkg -L`).
fn package_files(package: &str) -> Vec<PathBuf> {
    let out = dpkg_query(&["-L", package]);
    assert!(out.status.success(), "dpkg -L {package}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(PathBuf::from)
        .collect()
}

/// Installed packages: name → (what it depends on, alternatives in order; priority), and
/// virtual name → the installed packages that provide it.
struct Installed {
    packages: BTreeMap<String, (Vec<Vec<String>>, String)>,
    provides: BTreeMap<String, Vec<String>>,
}

fn names(field: &str) -> Vec<Vec<String>> {
    field
        .split(',')
        .map(|group| {
            group
                .split('|')
                .filter_map(|alt| {
                    let name = alt.split(['(', ' ', ':']).find(|s| !s.is_empty())?;
                    Some(name.to_string())
                })
                .collect::<Vec<_>>()
        })
        .filter(|alts| !alts.is_empty())
        .collect()
}

impl Installed {
    fn read() -> Installed {
        let out = dpkg_query(&[
            "-W",
            "-f=${Package}\t${Status}\t${Priority}\t${Pre-Depends}, ${Depends}\t${Provides}\n",
        ]);
        let mut packages = BTreeMap::new();
        let mut provides: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in String::from_utf8(out.stdout).unwrap().lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            let [name, status, priority, depends, provided] = fields[..] else {
                continue;
            };
            if status != "install ok installed" {
                continue;
            }
            for virtual_name in names(provided).into_iter().flatten() {
                provides
                    .entry(virtual_name)
                    .or_default()
                    .push(name.to_string());
            }
            packages.insert(name.to_string(), (names(depends), priority.to_string()));
        }
        Installed { packages, provides }
    }

    /// The installed package that satisfies `name` (itself, or one providing it).
    fn resolve(&self, name: &str) -> Option<String> {
        if self.packages.contains_key(name) {
            return Some(name.to_string());
        }
        self.provides.get(name)?.first().cloned()
    }

    /// `roots` and everything they depend on (Pre-Depends and Depends, never Recommends),
    /// the first installed alternative of each.
    fn closure(&self, roots: &[String]) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<String> = roots.to_vec();
        while let Some(name) = todo.pop() {
            let Some(package) = self.resolve(&name) else {
                continue;
            };
            if !seen.insert(package.clone()) {
                continue;
            }
            for alternatives in &self.packages[&package].0 {
                if let Some(found) = alternatives.iter().find_map(|a| self.resolve(a)) {
                    todo.push(found);
                }
            }
        }
        seen
    }

    /// What every Debian image has: the `required` packages (debian:bookworm-slim is those
    /// and apt).
    fn required(&self) -> BTreeSet<String> {
        self.packages
            .iter()
            .filter(|(_, (_, priority))| priority == "required")
            .map(|(name, _)| name.clone())
            .collect()
    }
}

/// The package owning `path`, trying the merged-/usr twin when dpkg knows the other name.
fn owner(path: &Path) -> Option<String> {
    let text = path.to_string_lossy().to_string();
    let twin = match text.strip_prefix("/usr") {
        Some(rest) => rest.to_string(),
        None => format!("/usr{text}"),
    };
    for candidate in [text, twin] {
        let out = dpkg_query(&["-S", &candidate]);
        if out.status.success() {
            let line = String::from_utf8(out.stdout).unwrap();
            let package = line.split(':').next()?.trim().to_string();
            return Some(package);
        }
    }
    None
}

/// The shared libraries `binary` loads (`ldd`).
fn shared_libraries(binary: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(binary).output().unwrap();
    assert!(out.status.success(), "ldd {}", binary.display());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let path = line
                .split("=>")
                .nth(1)
                .unwrap_or(line)
                .split_whitespace()
                .next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Runs `hostcycle bmc <args>` with an environment of `PATH` alone.
fn hostcycle_bmc(path: &Path, args: &[String]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hostcycle"))
        .arg("bmc")
        .args(args)
        .env_clear()
        .env("PATH", path)
        .output()
        .unwrap()
}

/// The runtime stage's packages are installed here (Debian bookworm, the image's release);
/// a directory holding only links to the programs they install is the whole `PATH`; the
/// programs' libraries come from those packages' dependencies or the base image. With that,
/// `hostcycle bmc` reads, powers off and powers on the pyghmi IPMI BMC, and `ssh` runs. With
/// an empty `PATH` the same status read fails for want of ipmitool, so the `PATH` is what
/// mattered.
#[tokio::test]
async fn the_runtime_packages_alone_drive_an_ipmi_bmc() {
    let packages = apt_packages(&runtime_stage(&dockerfile()));
    for package in &packages {
        assert!(
            installed(package),
            "Debian package {package} (deploy/Dockerfile's runtime stage) is not installed; \
             {INSTALL_HINT}"
        );
    }

    // Only the packages' programs on PATH.
    let bin = tempfile::tempdir().unwrap();
    let mut linked = BTreeMap::new();
    for package in &packages {
        for file in package_files(package) {
            let in_bin = file.parent().is_some_and(|d| {
                ["/usr/bin", "/usr/sbin", "/bin", "/sbin"].contains(&d.to_str().unwrap_or(""))
            });
            let executable = std::fs::metadata(&file).is_ok_and(|m| {
                use std::os::unix::fs::PermissionsExt;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            });
            if in_bin && executable {
                let name = file.file_name().unwrap().to_owned();
                std::os::unix::fs::symlink(&file, bin.path().join(&name)).unwrap();
                linked.insert(name.to_string_lossy().to_string(), file);
            }
        }
    }
    for program in ["ipmitool", "ssh"] {
        assert!(
            linked.contains_key(program),
            "the runtime packages install {program}: {:?}",
            linked.keys()
        );
    }
    assert!(
        Path::new("/etc/ssl/certs/ca-certificates.crt").is_file(),
        "ca-certificates provides the trust store the BMC client reads"
    );

    // Their libraries come with the packages (Depends, no Recommends) or the base image.
    let dpkg = Installed::read();
    let mut available = dpkg.closure(&packages);
    available.extend(dpkg.closure(&dpkg.required().into_iter().collect::<Vec<_>>()));
    let mut unowned = Vec::new();
    for program in ["ipmitool", "ssh"] {
        for library in shared_libraries(&linked[program]) {
            match owner(&library) {
                Some(package) if available.contains(&package) => {}
                other => unowned.push(format!("{program}: {} ({other:?})", library.display())),
            }
        }
    }
    assert!(
        unowned.is_empty(),
        "libraries the image's packages do not bring:\n  {}",
        unowned.join("\n  ")
    );

    // hostcycle bmc against the IPMI BMC with nothing else on PATH.
    hostcycle_testkit::require_program(
        "python with pyghmi (fake IPMI BMC)",
        &hostcycle_testkit::process::venv_bin("python"),
    )
    .unwrap_or_else(|e| panic!("{e}; {INSTALL_HINT}"));
    let bmc = FakeIpmiBmc::start(USER, PASSWORD, FakePower::On)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let files = tempfile::tempdir().unwrap();
    let password = files.path().join("password");
    std::fs::write(&password, PASSWORD).unwrap();
    let address = bmc.address();
    let connection = [
        "--address",
        address.as_str(),
        "--username",
        USER,
        "--password-file",
        password.to_str().unwrap(),
        "--output",
        "json",
    ];
    let run = |command: &[&str], path: &Path| {
        let args: Vec<String> = command
            .iter()
            .chain(connection.iter())
            .map(|a| a.to_string())
            .collect();
        let path = path.to_path_buf();
        async move {
            let out = tokio::task::spawn_blocking(move || hostcycle_bmc(&path, &args));
            tokio::time::timeout(Duration::from_secs(60), out)
                .await
                .expect("hostcycle bmc finished within 60 s")
                .unwrap()
        }
    };
    let power = |out: &std::process::Output| -> String {
        assert!(
            out.status.success(),
            "hostcycle bmc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        report["power_state"].as_str().unwrap().to_string()
    };
    assert_eq!(power(&run(&["status"], bin.path()).await), "on");
    let off = run(&["off", "--hard", "--poll-interval", "200ms"], bin.path()).await;
    assert_eq!(power(&off), "off");
    assert_eq!(bmc.power_state().unwrap(), FakePower::Off);
    let on = run(&["on", "--poll-interval", "200ms"], bin.path()).await;
    assert_eq!(power(&on), "on");
    assert_eq!(bmc.power_state().unwrap(), FakePower::On);

    // The control: without the packages' programs, ipmitool is not found.
    let empty = tempfile::tempdir().unwrap();
    let without = run(&["status"], empty.path()).await;
    assert!(!without.status.success());
    let stderr = String::from_utf8_lossy(&without.stderr);
    assert!(stderr.contains("ipmitool was not found"), "{stderr}");

    // ssh, as a reboot command would run it, found through the same PATH.
    let ssh = Command::new("ssh")
        .arg("-V")
        .env_clear()
        .env("PATH", bin.path())
        .output()
        .unwrap();
    assert!(ssh.status.success(), "ssh -V");
    assert!(
        String::from_utf8_lossy(&ssh.stderr).starts_with("OpenSSH_"),
        "{}",
        String::from_utf8_lossy(&ssh.stderr)
    );
}
