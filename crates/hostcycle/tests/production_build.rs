//! The production binary (deploy/Dockerfile: default features) carries no lab and no test
//! rig: `hostcycle lab` and `hostcycle sim` exist only with the `lab` feature, which
//! `make lab` and `make test` turn on, and only then are hostcycle-testkit and
//! hostcycle-sim linked.
#![allow(clippy::unwrap_used)]

use std::process::Command;

const LAB_CRATES: [&str; 2] = ["hostcycle-testkit", "hostcycle-sim"];

/// The packages `hostcycle` links (normal dependencies, transitively) with `features`.
fn linked_packages(features: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "-p",
            "hostcycle",
            "-e",
            "normal",
            "--locked",
            "--offline",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .args(features)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

#[test]
fn the_test_rig_is_linked_only_with_the_lab_feature() {
    let production = linked_packages(&[]);
    assert!(production.iter().any(|p| p == "hostcycle-operator"));
    for lab_crate in LAB_CRATES {
        assert!(
            !production.iter().any(|p| p == lab_crate),
            "the production build links {lab_crate}"
        );
    }
    let lab = linked_packages(&["--features", "lab"]);
    for lab_crate in LAB_CRATES {
        assert!(
            lab.iter().any(|p| p == lab_crate),
            "`--features lab` links {lab_crate}"
        );
    }
}

/// The binary these tests run was built with or without the feature; either way its
/// subcommands follow it.
#[test]
fn lab_and_sim_exist_only_with_the_lab_feature() {
    let hostcycle = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_hostcycle"))
            .args(args)
            .output()
            .unwrap()
    };
    let help = String::from_utf8(hostcycle(&["--help"]).stdout).unwrap();
    for subcommand in ["lab", "sim"] {
        let listed = help
            .lines()
            .any(|l| l.trim_start().starts_with(&format!("{subcommand} ")));
        let run = hostcycle(&[subcommand, "--help"]);
        if cfg!(feature = "lab") {
            assert!(listed, "--help lists {subcommand}:\n{help}");
            assert!(run.status.success(), "hostcycle {subcommand} --help");
        } else {
            assert!(
                !listed,
                "--help lists {subcommand} without the lab:\n{help}"
            );
            assert_eq!(run.status.code(), Some(2), "hostcycle {subcommand}");
            assert!(
                String::from_utf8_lossy(&run.stderr).contains("unrecognized subcommand"),
                "{}",
                String::from_utf8_lossy(&run.stderr)
            );
        }
    }
    // The production commands are there in both builds.
    for subcommand in ["operator", "bmc", "reboot-queue", "crd", "manifests"] {
        assert!(
            hostcycle(&[subcommand, "--help"]).status.success(),
            "hostcycle {subcommand} --help"
        );
    }
}

/// The image is built with the default features.
#[test]
fn the_dockerfile_builds_without_the_lab() {
    let dockerfile = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/Dockerfile"),
    )
    .unwrap();
    let build = dockerfile
        .lines()
        .find(|l| l.contains("cargo build"))
        .expect("the Dockerfile runs cargo build");
    assert!(build.contains("-p hostcycle"), "{build}");
    for flag in ["--features", "--all-features", "-F "] {
        assert!(!build.contains(flag), "{build}");
    }
}
