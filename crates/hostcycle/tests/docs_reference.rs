//! The reference pages cannot drift from the code: every flag of every `hostcycle` command
//! (from the real binary's `--help`), every `spec` field of the CRDs (from the generated
//! schema), every annotation, label and finalizer key and every environment variable the code
//! defines must be in docs/configuration.md; every metric the operator exports in
//! docs/metrics.md, with its type; every message quoted in docs/troubleshooting.md must occur in
//! the source, and every Event reason must be listed there; links between the docs must land.
//! No cluster needed: runs in well under a second.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Every `.rs` file under `dir` (recursively).
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The `src/` trees of the workspace's crates: what the shipped binary is built from.
fn source_files() -> Vec<PathBuf> {
    let crates = repo_root().join("crates");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&crates).expect("crates/").flatten() {
        out.extend(rust_files(&entry.path().join("src")));
    }
    assert!(out.len() > 50, "found only {} source files", out.len());
    out
}

/// The inline code spans of a Markdown line (single or multiple backticks).
fn code_spans(line: &str) -> Vec<String> {
    let bytes = line.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let open = bytes[i..].iter().take_while(|&&b| b == b'`').count();
        let start = i + open;
        let mut j = start;
        let mut closed = None;
        while j < bytes.len() {
            if bytes[j] == b'`' {
                let run = bytes[j..].iter().take_while(|&&b| b == b'`').count();
                if run == open {
                    closed = Some(j);
                    break;
                }
                j += run;
            } else {
                j += 1;
            }
        }
        match closed {
            Some(end) => {
                let mut text = &line[start..end];
                if open > 1 && text.starts_with(' ') && text.ends_with(' ') && text.len() > 1 {
                    text = &text[1..text.len() - 1];
                }
                spans.push(text.to_string());
                i = end + open;
            }
            None => i = start,
        }
    }
    spans
}

/// Every code span of a text.
fn all_code_spans(text: &str) -> BTreeSet<String> {
    text.lines().flat_map(code_spans).collect()
}

/// The text under the first heading whose line contains `needle`, up to the next heading of
/// the same or a higher level.
fn section<'a>(doc: &'a str, needle: &str) -> &'a str {
    let mut start = None;
    let mut level = 0;
    let mut offset = 0;
    let mut in_fence = false;
    for line in doc.split_inclusive('\n') {
        if line.starts_with("```") {
            in_fence = !in_fence;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let heading = !in_fence && hashes > 0 && line[hashes..].starts_with(' ');
        match start {
            None if heading && line.contains(needle) => {
                start = Some(offset + line.len());
                level = hashes;
            }
            Some(begin) if heading && hashes <= level => return &doc[begin..offset],
            _ => {}
        }
        offset += line.len();
    }
    match start {
        Some(begin) => &doc[begin..],
        None => panic!("no heading containing {needle:?}"),
    }
}

/// GitHub's anchor for a heading text.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown document's headings.
fn anchors(doc: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_fence = false;
    for line in doc.lines() {
        if line.starts_with("```") {
            in_fence = !in_fence;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !in_fence && hashes > 0 && line[hashes..].starts_with(' ') {
            out.insert(slug(&line[hashes..]));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Flags

fn hostcycle_help(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_hostcycle"))
        .args(args)
        .arg("--help")
        .output()
        .expect("running hostcycle --help");
    assert!(output.status.success(), "hostcycle {args:?} --help failed");
    String::from_utf8(output.stdout).expect("UTF-8 help")
}

/// The subcommands listed under `Commands:` (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// The long flags of a help text (`--name`), without `--help` and `--version`.
fn long_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|line| {
            let mut rest = line.trim_start();
            if rest.len() > 4 && rest.starts_with('-') && &rest[2..4] == ", " {
                rest = &rest[4..];
            }
            let name: String = rest
                .strip_prefix("--")?
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            (!name.is_empty()).then(|| format!("--{name}"))
        })
        .filter(|f| f != "--help" && f != "--version")
        .collect()
}

/// Every leaf command (`["bmc", "off"]`, `["operator"]`, …) with its flags.
fn leaf_commands() -> Vec<(Vec<String>, BTreeSet<String>)> {
    let mut out = Vec::new();
    let mut todo: Vec<Vec<String>> = subcommands(&hostcycle_help(&[]))
        .into_iter()
        .map(|c| vec![c])
        .collect();
    while let Some(path) = todo.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let help = hostcycle_help(&args);
        let nested = subcommands(&help);
        if nested.is_empty() {
            out.push((path, long_flags(&help)));
        } else {
            // A command with subcommands may also have flags of its own (global to them).
            out.push((path.clone(), long_flags(&help)));
            todo.extend(nested.into_iter().map(|c| {
                let mut p = path.clone();
                p.push(c);
                p
            }));
        }
    }
    out
}

#[test]
fn every_flag_of_every_command_is_in_the_configuration_reference() {
    let doc = read("docs/configuration.md");
    let global = long_flags(&hostcycle_help(&[]));
    assert!(global.contains("--log-format"), "{global:?}");
    let global_section = all_code_spans(section(&doc, "Global flags"));
    let mut missing = Vec::new();
    for flag in &global {
        if !global_section.contains(flag) {
            missing.push(format!("global flag {flag} (section \"Global flags\")"));
        }
    }
    let commands = leaf_commands();
    let operator = commands
        .iter()
        .find(|(path, _)| path == &["operator"])
        .expect("hostcycle operator");
    assert!(
        operator.1.contains("--bmc-call-deadline") && operator.1.len() > 15,
        "operator flags not read from --help: {:?}",
        operator.1
    );
    for (path, flags) in &commands {
        let own: Vec<&String> = flags.iter().filter(|f| !global.contains(*f)).collect();
        if own.is_empty() {
            continue;
        }
        let heading = format!("`hostcycle {}`", path[0]);
        if !doc
            .lines()
            .any(|l| l.starts_with('#') && l.contains(&heading))
        {
            missing.push(format!(
                "a section \"## {heading}\" for the flags of `hostcycle {}`",
                path.join(" ")
            ));
            continue;
        }
        let documented = all_code_spans(section(&doc, &heading));
        for flag in own {
            if !documented.contains(flag) {
                missing.push(format!("{flag} of `hostcycle {}`", path.join(" ")));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/configuration.md lacks (document each in a table row, in backticks):\n  {}",
        missing.join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------
// CRD fields

/// Paths under `spec` (`maxConcurrentReboots`, `drainBackoff.baseSeconds`, …). Kubernetes'
/// own types (label selectors, object references) are one field each.
fn spec_paths(schema: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
    let Some(properties) = schema.get("properties").and_then(|p| p.as_object()) else {
        return;
    };
    for (name, child) in properties {
        let path = format!("{prefix}{name}");
        out.push(path.clone());
        let child_props = child.get("properties").and_then(|p| p.as_object());
        let foreign =
            child_props.is_some_and(|p| p.contains_key("matchLabels") || p.contains_key("uid"));
        if !foreign {
            spec_paths(child, &format!("{path}."), out);
        }
    }
}

#[test]
fn every_spec_field_of_every_crd_is_in_the_configuration_reference() {
    let doc = read("docs/configuration.md");
    let mut missing = Vec::new();
    let mut checked = 0;
    for crd in hostcycle_api::crds() {
        let kind = crd.spec.names.kind.clone();
        let crd = serde_json::to_value(&crd).expect("CRD as JSON");
        let Some(versions) = crd.pointer("/spec/versions").and_then(|v| v.as_array()) else {
            panic!("{kind}: no versions");
        };
        let documented = all_code_spans(section(&doc, &format!("### `{kind}`")));
        for version in versions {
            let Some(spec) = version.pointer("/schema/openAPIV3Schema/properties/spec") else {
                continue;
            };
            let mut paths = Vec::new();
            spec_paths(spec, "", &mut paths);
            for path in paths {
                checked += 1;
                let field = format!("spec.{path}");
                if !documented.contains(&field) {
                    missing.push(format!("{kind} {field}"));
                }
            }
        }
    }
    assert!(checked > 40, "only {checked} spec fields found");
    assert!(
        missing.is_empty(),
        "docs/configuration.md lacks these fields (a row with the path in backticks in the \
         kind's section):\n  {}",
        missing.join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------
// Annotations, labels, finalizers, environment variables

/// `const NAME: &str = "value"` in a source text (value on the same or the next line).
fn string_consts(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("const ") {
        rest = &rest[at + 6..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        let after = rest[name.len()..].trim_start();
        let Some(after) = after.strip_prefix(':') else {
            continue;
        };
        let Some(after) = after.trim_start().strip_prefix("&str") else {
            continue;
        };
        let Some(after) = after.trim_start().strip_prefix('=') else {
            continue;
        };
        let Some(after) = after.trim_start().strip_prefix('"') else {
            continue;
        };
        if let Some(end) = after.find('"') {
            out.push((name, after[..end].to_string()));
        }
    }
    out
}

#[test]
fn every_annotation_label_and_finalizer_key_is_in_the_configuration_reference() {
    let doc = read("docs/configuration.md");
    let documented = all_code_spans(section(&doc, "Annotations, labels and finalizers"));
    let mut keys = BTreeMap::new();
    for file in source_files() {
        let text = std::fs::read_to_string(&file).expect("source file");
        for (name, value) in string_consts(&text) {
            let is_key = ["ANNOTATION", "LABEL", "FINALIZER", "PREFIX"]
                .iter()
                .any(|suffix| name.ends_with(suffix));
            // Reason constants are CamelCase words; keys have a domain.
            if is_key && value.contains('.') && !file.to_string_lossy().contains("testkit") {
                keys.insert(value, name);
            }
        }
    }
    assert!(keys.len() > 25, "only {} keys found: {keys:?}", keys.len());
    let missing: Vec<String> = keys
        .iter()
        .filter(|(key, _)| !documented.contains(*key))
        .map(|(key, name)| format!("{key} ({name})"))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md (\"Annotations, labels and finalizers\") lacks:\n  {}",
        missing.join("\n  ")
    );
}

/// Environment variables named in a source text: `env::var("X")`, `env::var_os("X")`,
/// clap's `env = "X"`, and any `"HOSTCYCLE_…"` literal.
fn env_vars(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for marker in ["env::var(\"", "env::var_os(\"", "env = \"", "\"HOSTCYCLE_"] {
        let mut rest = text;
        while let Some(at) = rest.find(marker) {
            rest = &rest[at + marker.len()..];
            let prefix = if marker == "\"HOSTCYCLE_" {
                "HOSTCYCLE_"
            } else {
                ""
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if rest[name.len()..].starts_with('"') && !(prefix.is_empty() && name.is_empty()) {
                out.insert(format!("{prefix}{name}"));
            }
        }
    }
    out
}

#[test]
fn every_environment_variable_is_in_the_configuration_reference() {
    let doc = read("docs/configuration.md");
    let documented = section(&doc, "Environment variables");
    let mut vars = BTreeSet::new();
    for file in source_files() {
        vars.extend(env_vars(&std::fs::read_to_string(&file).expect("source")));
    }
    for expected in ["POD_NAME", "HOSTCYCLE_BMC_PASSWORD", "HOSTCYCLE_LOG_FORMAT"] {
        assert!(vars.contains(expected), "{expected} not found in {vars:?}");
    }
    let missing: Vec<&String> = vars
        .iter()
        .filter(|v| !documented.contains(&format!("`{v}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md (\"Environment variables\") lacks: {missing:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Metrics

#[test]
fn every_exported_metric_is_in_the_metrics_page_with_its_type() {
    let doc = read("docs/metrics.md");
    let table = section(&doc, "The whole list");
    let mut documented = BTreeMap::new();
    for line in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(name), Some(kind)) = (code_spans(cells[1]).first().cloned(), cells.get(2)) else {
            continue;
        };
        documented.insert(name, kind.to_string());
    }
    let exported = hostcycle_operator::metrics::exported_metrics().expect("encoding the registry");
    assert!(exported.len() > 20, "{exported:?}");
    let mut problems = Vec::new();
    for metric in &exported {
        match documented.get(&metric.name) {
            None => problems.push(format!(
                "missing: {} ({}, \"{}\")",
                metric.name, metric.kind, metric.help
            )),
            Some(kind) if *kind != metric.kind => problems.push(format!(
                "{}: documented as {kind}, exported as {}",
                metric.name, metric.kind
            )),
            Some(_) => {}
        }
    }
    for name in documented.keys() {
        if !exported.iter().any(|m| &m.name == name) {
            problems.push(format!("documented but not exported: {name}"));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/metrics.md (\"The whole list\") is out of date:\n  {}",
        problems.join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------
// Troubleshooting

/// A source text as the strings in it read: string continuations (`\` + newline + indent)
/// joined, `\"` unescaped, format braces `{{ }}` single.
fn normalized(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'\n') => {
                chars.next();
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
            }
            '\\' if chars.peek() == Some(&'"') => {}
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            c => out.push(c),
        }
    }
    out
}

/// The literal parts of a quoted message: the text between `{placeholder}`s and `…`.
fn fragments(message: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut depth = 0;
    for c in message.chars() {
        match c {
            '{' => {
                depth += 1;
                out.push(std::mem::take(&mut current));
            }
            '}' if depth > 0 => depth -= 1,
            '…' if depth == 0 => out.push(std::mem::take(&mut current)),
            c if depth == 0 => current.push(c),
            _ => {}
        }
    }
    out.push(current);
    out.into_iter().filter(|f| !f.trim().is_empty()).collect()
}

/// Whether the fragments occur in this order, each within `gap` bytes after the previous.
fn occurs_in_order(haystack: &str, fragments: &[String], gap: usize) -> bool {
    let mut from = 0;
    while let Some(found) = haystack[from..].find(fragments[0].as_str()) {
        let start = from + found;
        let mut at = start + fragments[0].len();
        let mut ok = true;
        for fragment in &fragments[1..] {
            let window_end = (at + gap + fragment.len()).min(haystack.len());
            let window_end = (window_end..=haystack.len())
                .find(|&i| haystack.is_char_boundary(i))
                .unwrap_or(haystack.len());
            match haystack[at..window_end].find(fragment.as_str()) {
                Some(i) => at += i + fragment.len(),
                None => {
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            return true;
        }
        from = start + fragments[0].len();
    }
    false
}

/// The messages quoted on `Message:` lines: the first code span of each (what follows it is
/// commentary).
fn quoted_messages(doc: &str) -> Vec<String> {
    doc.lines()
        .map(|l| l.trim_start_matches(['-', '>', ' ']))
        .filter(|l| l.starts_with("Message:"))
        .map(|l| {
            code_spans(l)
                .into_iter()
                .next()
                .unwrap_or_else(|| panic!("a Message: line quotes nothing: {l}"))
        })
        .collect()
}

#[test]
fn every_message_quoted_in_troubleshooting_occurs_in_the_source() {
    let doc = read("docs/troubleshooting.md");
    let messages = quoted_messages(&doc);
    assert!(
        messages.len() >= 40,
        "only {} quoted messages",
        messages.len()
    );
    let sources: Vec<(PathBuf, String)> = source_files()
        .into_iter()
        .map(|p| {
            let text = normalized(&std::fs::read_to_string(&p).expect("source"));
            (p, text)
        })
        .collect();
    let mut missing = Vec::new();
    for message in &messages {
        let parts = fragments(message);
        if parts.iter().map(|p| p.len()).sum::<usize>() < 12 {
            missing.push(format!("{message} (too little literal text to recognise)"));
        } else if !sources
            .iter()
            .any(|(_, text)| occurs_in_order(text, &parts, 160))
        {
            missing.push(message.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md quotes messages no source file under crates/*/src emits \
         (placeholders are {{name}} or …):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn the_fragment_matcher_is_strict() {
    let source = normalized(
        "format!(\"BMC {endpoint} rejected the credentials ({detail}); check the \\\n        username\")",
    );
    let ok = fragments("BMC {endpoint} rejected the credentials ({detail}); check the username");
    assert!(occurs_in_order(&source, &ok, 160), "{source}");
    let reordered = fragments("check the username {x} rejected the credentials");
    assert!(!occurs_in_order(&source, &reordered, 160));
    let invented = fragments("BMC {endpoint} accepted the credentials");
    assert!(!occurs_in_order(&source, &invented, 160));
}

#[test]
fn troubleshooting_has_the_anchors_the_alerts_link_to() {
    let doc = read("docs/troubleshooting.md");
    let have = anchors(&doc);
    for anchor in [
        "bmc-unreachable",
        "bmc-credentials-rejected",
        "bmc-tls-error",
        "reboot-stuck",
        "boot-timeout",
        "queue-backed-off",
        "remediation-failed",
        "remediation-blocked",
        "health-check-storm",
        "no-leader",
        "operator-not-ready",
        "crds-missing",
        "rbac-forbidden",
        "webhook-denied",
    ] {
        assert!(
            have.contains(anchor),
            "docs/troubleshooting.md has no heading with anchor #{anchor}"
        );
    }
}

/// `pub const X: &str = "Reason"` inside `mod event_reason` / `mod queue_event_reason`.
fn event_reasons() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for file in source_files() {
        let text = std::fs::read_to_string(&file).expect("source");
        for marker in ["mod event_reason {", "mod queue_event_reason {"] {
            let mut rest = text.as_str();
            while let Some(at) = rest.find(marker) {
                let body = &rest[at..];
                let end = body.find("\n}").unwrap_or(body.len());
                out.extend(string_consts(&body[..end]).into_iter().map(|(_, v)| v));
                rest = &body[marker.len()..];
            }
        }
    }
    out
}

#[test]
fn every_event_reason_is_listed_in_troubleshooting() {
    let doc = read("docs/troubleshooting.md");
    let listed = all_code_spans(section(&doc, "Events at a glance"));
    let reasons = event_reasons();
    assert!(reasons.len() > 40, "{reasons:?}");
    let missing: Vec<&String> = reasons.iter().filter(|r| !listed.contains(*r)).collect();
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md (\"Events at a glance\") lacks: {missing:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Links

/// Files other branches of issue 10 add (the webhook's guide, the alerting rules), linked
/// before they land. Remove a name once its file exists; the check then applies to it as to
/// every other link.
const PENDING_FILES: &[&str] = &["docs/webhook.md", "deploy/monitoring/prometheus-rule.yaml"];

fn markdown_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut out = vec![root.join("README.md"), root.join("deploy/README.md")];
    let mut stack = vec![root.join("docs")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    out
}

/// Relative link targets of a Markdown text: `](target)`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                let target = &rest[..end];
                if !target.contains("://") && !target.starts_with("mailto:") {
                    out.push(target.to_string());
                }
                rest = &rest[end..];
            }
        }
    }
    out
}

#[test]
fn links_between_the_docs_land() {
    let root = std::fs::canonicalize(repo_root()).expect("repo root");
    let mut broken = Vec::new();
    for file in markdown_files() {
        let file = std::fs::canonicalize(&file).expect("markdown file");
        let text = std::fs::read_to_string(&file).expect("markdown");
        let dir = file.parent().expect("parent");
        for target in links(&text) {
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            let shown = format!(
                "{} → {target}",
                file.strip_prefix(&root).unwrap_or(&file).display()
            );
            let Ok(canonical) = std::fs::canonicalize(&resolved) else {
                let relative = resolved.components().fold(PathBuf::new(), |mut acc, c| {
                    match c {
                        std::path::Component::ParentDir => {
                            acc.pop();
                        }
                        std::path::Component::CurDir => {}
                        other => acc.push(other),
                    }
                    acc
                });
                let pending = PENDING_FILES.iter().any(|p| relative.ends_with(p));
                if !pending {
                    broken.push(format!("{shown}: no such file"));
                }
                continue;
            };
            if let Some(anchor) = anchor
                && canonical.extension().is_some_and(|e| e == "md")
            {
                let target_text = std::fs::read_to_string(&canonical).expect("target");
                if !anchors(&target_text).contains(anchor) {
                    broken.push(format!("{shown}: no heading #{anchor}"));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "broken links:\n  {}",
        broken.join("\n  ")
    );
}
